// Package arp keeps the neighbour table (IP → MAC → node) learned by
// watching ARP and IPv6 NDP.
package arp
