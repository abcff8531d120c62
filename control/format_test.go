package control

import (
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
	}{
		{"object", `{"node":3,"mac":"2e:87:04:07:00:03","engine":{"tx":10}}`,
			[]string{"engine.tx  10", "mac        2e:87:04:07:00:03", "node       3"}},
		{"table", `[{"ip":"10.0.0.1","node":1},{"ip":"10.0.0.2","node":2,"extra":true}]`,
			[]string{"EXTRA  IP        NODE", "       10.0.0.1  1", "true   10.0.0.2  2"}},
		{"empty", `[]`, []string{"(none)"}},
		{"scalar", `42`, []string{"42"}},
		{"float", `{"rtt_us":1.250000}`, []string{"rtt_us  1.25"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			if err := Format(&b, []byte(tt.in)); err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
			for i := range got {
				got[i] = strings.TrimRight(got[i], " ")
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
	if err := Format(&strings.Builder{}, []byte(`{bad`)); err == nil {
		t.Error("bad JSON formatted without error")
	}
}
