// Package taptest provides an in-memory tap.Device for tests of code that
// sits on a TAP (the EXT-Eth engine), and RunContract, the behavioural
// contract every tap.Device must meet. The real *tap.TAP and *Device both
// run it, so the fake cannot drift from the real device's semantics.
package taptest
