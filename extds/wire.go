package extds

// The wire formats of EXT-DS are package internal/wire (its doc.go has
// the tables). What of them is extds's API is here: the message tags and
// ErrProtocol. No state, no locks.

import "github.com/exn-project/exn/extds/internal/wire"

// VELO user tags (Table 5.3, plus RESET, the ZCopy messages and the
// agreement's). They start at 0x40 so a stray EXT-Eth message (which
// uses low tags) is never mistaken for one.
const (
	TagVELO        = wire.TagVELO
	TagVELOLast    = wire.TagVELOLast
	TagRMAInfo     = wire.TagRMAInfo
	TagRMAAvail    = wire.TagRMAAvail
	TagShutdown    = wire.TagShutdown
	TagReset       = wire.TagReset
	TagZCSrc       = wire.TagZCSrc
	TagZCWant      = wire.TagZCWant
	TagZCSink      = wire.TagZCSink
	TagZCPut       = wire.TagZCPut
	TagZCDone      = wire.TagZCDone
	TagNoConn      = wire.TagNoConn
	TagProbe       = wire.TagProbe
	TagProbeRep    = wire.TagProbeRep
	TagClaim       = wire.TagClaim
	TagClaimRep    = wire.TagClaimRep
	TagClaimDirect = wire.TagClaimDirect
	TagCommit      = wire.TagCommit
)

// ErrProtocol marks a peer that broke the EXT-DS protocol (a malformed
// message, a credit overflow, an RMA_INFO outside the ring). The
// connection is reset.
var ErrProtocol = wire.ErrProtocol
