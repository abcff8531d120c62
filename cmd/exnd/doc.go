// Command exnd is one node of an exn fabric: it terminates the exn0 TAP
// and carries its Ethernet frames over the (emulated) Extoll fabric.
//
//	exnd --node-id N --fabric mem|shm:NAME|net:LISTEN_ADDR|ofi:PROVIDER [--peers FILE]
//	     [--ifname exn0] [--addr CIDR] [--mtu 65521] [--eager-threshold 480]
//	     [--netstack] [--metrics ADDR] [--control PATH] [--log-level info]
//	     [--config FILE] [--check-config]
//
// Every flag can also be set in the --config file ("name = value" lines);
// --check-config validates flags and file and exits 0 or 2. exnd shuts
// down cleanly on SIGINT and SIGTERM. See docs/operations.md.
//
// # Ownership and imports
//
// cmd/exnd owns nothing but main: it parses the configuration through
// the gateway library (gateway.Configure), runs one node (gateway.Run)
// until a signal, and exits with the status. It may import gateway and the
// standard library.
package main
