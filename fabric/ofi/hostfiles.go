package ofi

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strings"
)

// bellDir is where host bells live; the shm provider keeps its regions
// there too.
const bellDir = "/dev/shm"

// bellBase is the path, without its suffix, of the host bell of the NIC
// whose address (fi_getname) is name (hostbell.go).
func bellBase(name []byte) string {
	h := fnv.New64a()
	h.Write(name)
	return filepath.Join(bellDir, fmt.Sprintf("exn-ofi-%016x", h.Sum64()))
}

// HostFiles lists the files in /dev/shm that belong to the NIC whose
// address is name: its host bell (ofi:shm) and, for a string address of
// the shm provider ("fi_shm://ID" or "fi_ns://HOST:PORT"), the provider's
// own region. A NIC removes them when it closes; after a process was
// killed, whoever started it removes them (the tests do).
func HostFiles(name []byte) []string {
	base := bellBase(name)
	files := []string{base + ".word", base + ".bell"}
	s := string(bytes.TrimRight(name, "\x00"))
	for _, scheme := range []string{"fi_shm://", "fi_ns://"} {
		if id, ok := strings.CutPrefix(s, scheme); ok && id != "" && !strings.ContainsRune(id, '/') {
			files = append(files, filepath.Join(bellDir, id))
		}
	}
	return files
}
