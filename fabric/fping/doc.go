// Package fping is a fabric-level ping: VELO ping-pong between management
// endpoints, in the style of ibping. exnd runs a Responder on its
// management VPID; exnctl ping asks exnd to Ping a node and reports RTTs.
//
// # Ownership and imports
//
// fping owns the ping protocol (message layout, sequence matching, the
// responder loop). It may import fabric, internal/ratelog and the standard
// library; the daemon (responder, exnctl ping) imports it.
package fping
