// Package nstest is the harness for exn's root-only tests: network
// namespaces, commands run inside them with timeouts, exnd nodes on a
// shared-memory fabric, and the tidy-up of all of it.
//
// Every resource is named after the test process (exnt-<pid>-...), torn
// down in t.Cleanup, and also recorded in a process-wide registry that
// Main tears down on SIGINT or SIGTERM and after the tests; Main also
// sweeps resources left behind by test processes that no longer exist.
// Every process started here is in its own process group, gets SIGKILL if
// the test process dies (Pdeathsig), and is killed as a group on cleanup.
//
// # Ownership and imports
//
// nstest owns the root-only test resources (namespaces, veths, exnd
// processes, shm files) and their clean-up; what a test asserts stays in
// the test. It may import control (to query the exnd nodes it starts),
// internal/testenv and the standard library, and runs the built binaries
// rather than importing exn's packages. Only tests import it.
package nstest
