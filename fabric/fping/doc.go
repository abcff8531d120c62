// Package fping is a fabric-level ping: VELO ping-pong between management
// endpoints, in the style of ibping. exnd runs a Responder on its
// management VPID; exnctl ping asks exnd to Ping a node and reports RTTs.
package fping
