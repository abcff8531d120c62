// Package peers parses exnd's peers file (docs/design.md "Commands").
//
// The file has one node a line:
//
//	NODE_ID ADDRESS[:PORT] [IP]
//
// NODE_ID is a decimal fabric node ID (0..65535). ADDRESS is a host name,
// an IPv4 address or an IPv6 address (in brackets when a port follows); it
// is how the net fabric backend reaches the node and is kept as given. IP is
// the node's optional address on exn0, which seeds the neighbour table
// (package arp). '#' starts a comment that runs to the end of the line;
// blank lines are ignored.
//
// Parse rejects, with a *ParseError naming the line and field: a node ID
// that is not a decimal number in range, a malformed address or port, a bad
// or non-unicast IP, extra fields, and a node ID or IP that appears twice.
//
// # Ownership and imports
//
// peers owns the file format and its validation, nothing of how peers are
// reached. It may import fabric (node IDs) and the standard library; the
// net and ofi backends, arp, fabric/backend and the daemon use it.
package peers
