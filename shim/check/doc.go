// Package check holds the tests of libextds.so, the LD_PRELOAD socket
// switch for EXT-DS (../libextds.c and its units; docs/shim.md). The
// library is C, not Go: it runs inside arbitrary processes across fork and
// signals. The tests build it with its one recipe (../Makefile, through
// testenv.CompileShim), check its exports against ../libextds.map, and
// drive small C programs (../test) and unmodified iperf3 and sockperf
// through it, against a fake exnd control server.
package check
