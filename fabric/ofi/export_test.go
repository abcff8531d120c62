//go:build ofi && cgo

package ofi

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
)

// RemoveHostFiles removes what a NIC with address name (fi_getname) that
// was killed before its Close leaves in /dev/shm: its host bell and, on
// shm, the provider's region (named after the address without its
// "fi_shm://" scheme). Tests that kill child processes call it.
func RemoveHostFiles(name []byte) {
	base := bellBase(name)
	os.Remove(base + ".word")
	os.Remove(base + ".bell")
	if s, ok := strings.CutPrefix(string(bytes.TrimRight(name, "\x00")), "fi_shm://"); ok && s != "" && !strings.ContainsRune(s, '/') {
		os.Remove(filepath.Join(bellDir, s))
	}
}
