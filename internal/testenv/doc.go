// Package testenv holds the test-environment policy shared by every
// package's tests: when privileged tests run or skip, test sizes, leak
// checks, bounded waits (Eventually, Within, Go), helper processes,
// loopback TCP servers (ListenTCP, ServeTCP, AcceptLoop), the kind-byte
// test servers with their sized ping-pong (ServeKinds, EchoSized,
// OpenSized), socketpairs (UnixPair), and building the C programs the
// tests run (CC, CompileShim, ModulePath).
//
// # Ownership and imports
//
// testenv owns the policy (EXN_REQUIRE_PRIVILEGED, EXN_TEST_SMALL, the
// goroutine-leak check); each test keeps its own set-up. It is for tests
// and test harnesses only (fabric/fabrictest, integration/nstest and
// _test.go files) and imports only the standard library and
// go.uber.org/goleak.
package testenv
