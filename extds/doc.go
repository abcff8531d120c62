// Package extds is EXT-DS: stream sockets that bypass TCP between peers on
// the fabric (§5.5 of the dissertation).
package extds
