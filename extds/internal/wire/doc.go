// Package wire is the wire formats of EXT-DS: the fabric messages a
// Device sends and receives (their tags, encoders and the one decoder the
// rx loop runs), the bodies of the out-of-band agreement's messages, and
// the handshake records of the shadow TCP connection. It is pure
// encoding: no state, no locks, no I/O, and no allocation on a decode
// (a decoded message aliases the payload).
//
// Ownership and imports: wire owns the byte layouts and their checks;
// what a message means is its user's (extds for a connection's messages
// and the handshake, extds/internal/agree for PROBE, CLAIM and their
// answers). It imports fabric (tags, addresses, the message buffer) and
// the standard library, nothing of extds. The fuzz targets of its
// decoders live here (fuzz_test.go, corpora in testdata/fuzz).
//
// Fabric messages (VELO, §5.5.3.1). Every payload starts with the 4-byte
// little-endian connection ID the *receiver* assigned in the handshake, so
// one virtual-device endpoint demultiplexes many connections. The rest
// depends on the tag; every length is checked exactly.
//
//	tag           payload after the conn ID            bytes
//	VELO          1..116 data bytes                     5..120
//	VELO_LAST     1..116 data bytes (last of a write)   5..120
//	RMA_INFO      ring offset u32, length u32           12
//	RMA_AVAIL     ring bytes freed u32, eager freed u32 12
//	SHUTDOWN      -                                     4
//	RESET         -                                     4
//	ZC_SRC        source NLA u64, length u32            16   (ZCopy read)
//	ZC_WANT       length u32                            8    (ZCopy write)
//	ZC_SINK       sink NLA u64, length u32              16   (ZCopy write)
//	ZC_PUT        length u32                            8    (ZCopy write)
//	ZC_DONE       -                                     4
//	NOCONN        -  (conn = the unknown ID it answers)   4
//	PROBE         port u16, 0 u8, 0 u8 (conn = token)   8
//	PROBE_REPLY   port u16, status u8, 0 u8             8
//	CLAIM         see claim.go                          44
//	CLAIM_REPLY   see claim.go                          8
//	CLAIM_DIRECT  see claim.go                          24
//	COMMIT        see claim.go                          8
//
// NOCONN answers a data message addressed to a connection ID the receiver
// does not know (released, stale): its ID field is that unknown ID, i.e.
// the *sender's* peer ID, so the sender finds its connection by (source
// address, peer ID) and fails it with ECONNRESET instead of waiting for
// credits forever. PROBE asks the node's Device whether an EXT-DS
// listener is registered for a TCP port; its ID field is a token chosen by
// the prober and echoed in PROBE_REPLY (status 1: listening, 0: not).
//
// Handshake (shadow TCP connection, fixed 32-byte records, little-endian):
//
//	hello  client→server: "EXDS" ver u8 status u8 node u16 vpid u8 flags u8
//	                      conn u32 ring NLA u64 ring size u32 eager window u32
//	reply  server→client: "EXDR" ver u8 status u8 node u16 vpid u8 0 u8
//	                      conn u32 ring NLA u64 ring size u32 eager window u32
//	ack    client→server: "EXDA" conn u32 (the server's conn ID), 8 bytes
//
// A direct offer (extds/direct.go) is a hello with flags = FlagDirect and
// only the node set; its answers are a reply with status StatusDirect
// (node, conn = token, ring = the buffer's ID, ring size) or
// StatusNeedRing (all else zero: send the ordinary hello), or
// StatusNoFab.
package wire
