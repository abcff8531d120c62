package bytesize

import "testing"

func TestName(t *testing.T) {
	for n, want := range map[int]string{0: "0B", 64: "64B", 1000: "1000B", 4096: "4KiB", 1 << 20: "1MiB", 3 << 19: "1536KiB", 8 << 20: "8MiB"} {
		if got := Name(n, ""); got != want {
			t.Errorf("Name(%d, \"\") = %q, want %q", n, got, want)
		}
		if got := Parse("RMA/get-" + want); got != n {
			t.Errorf("Parse(%q) = %d, want %d", want, got, n)
		}
	}
	if got := Name(4096, " "); got != "4 KiB" {
		t.Errorf("Name(4096, \" \") = %q", got)
	}
	if got := Parse("RMA/get"); got != 0 {
		t.Errorf("Parse without a size = %d", got)
	}
}
