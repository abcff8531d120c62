package bytesize

import (
	"fmt"
	"regexp"
	"strconv"
)

// Name formats n as 64B, 4KiB, 1MiB with sep between the number and the
// unit: KiB and MiB for exact multiples only (1536KiB, 1000B).
func Name(n int, sep string) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d%sMiB", n>>20, sep)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d%sKiB", n>>10, sep)
	}
	return fmt.Sprintf("%d%sB", n, sep)
}

var suffix = regexp.MustCompile(`(\d+)(B|KiB|MiB)$`)

// Parse reads the size Name(n, "") put at the end of s ("RMA/get-64KiB"):
// 0 if s does not end in one.
func Parse(s string) int {
	m := suffix.FindStringSubmatch(s)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	switch m[2] {
	case "KiB":
		n <<= 10
	case "MiB":
		n <<= 20
	}
	return n
}
