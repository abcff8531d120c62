package backend

import (
	"errors"
	"strings"
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/ofi"
)

func TestParse(t *testing.T) {
	tests := []struct {
		spec    string
		want    Spec
		wantErr string // substring; "" means success
	}{
		{spec: "mem", want: Spec{Kind: Mem}},
		{spec: "shm:test", want: Spec{Kind: SHM, Arg: "test"}},
		{spec: "shm:aB_c.1", want: Spec{Kind: SHM, Arg: "aB_c.1"}},
		{spec: "shm:a-b", wantErr: "not allowed"},
		{spec: "net:0.0.0.0:7000", want: Spec{Kind: Net, Arg: "0.0.0.0:7000"}},
		{spec: "net:[::1]:7000", want: Spec{Kind: Net, Arg: "[::1]:7000"}},
		{spec: "ofi:tcp", want: Spec{Kind: OFI, Arg: "tcp"}},
		{spec: "", wantErr: "empty spec"},
		{spec: "mem:x", wantErr: "mem takes no argument"},
		{spec: "shm", wantErr: "want shm:NAME"},
		{spec: "shm:", wantErr: "want shm:NAME"},
		{spec: "shm:../etc", wantErr: "not allowed"},
		{spec: "shm:a/b", wantErr: "not allowed"},
		{spec: "shm:.hidden", wantErr: "starts with a dot"},
		{spec: "shm:" + strings.Repeat("x", 65), wantErr: "at most 64"},
		{spec: "net", wantErr: "want net:LISTEN_ADDR"},
		{spec: "ofi:", wantErr: "want ofi:PROVIDER"},
		{spec: "rdma:x", wantErr: `unknown backend "rdma"`},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := Parse(tc.spec)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("Parse(%q) = %+v, want error containing %q", tc.spec, got, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrBadSpec) {
					t.Fatalf("Parse(%q) error %q, want ErrBadSpec containing %q", tc.spec, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.spec, err)
			}
			if got != tc.want {
				t.Fatalf("Parse(%q) = %+v, want %+v", tc.spec, got, tc.want)
			}
			if got.String() != tc.spec {
				t.Fatalf("String() = %q, want %q", got.String(), tc.spec)
			}
		})
	}
}

// fakeCluster records the node it was asked for, so the test can check
// that Open hands the mem spec to the cluster in Options.
type fakeCluster struct {
	asked []fabric.NodeID
	err   error
}

func (c *fakeCluster) NewNIC(n fabric.NodeID) (fabric.NIC, error) {
	c.asked = append(c.asked, n)
	return nil, c.err
}

func TestOpenErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		spec    string
		opts    Options
		is      error
		wantErr string
	}{
		{name: "mem without cluster", spec: "mem", is: ErrBadSpec, wantErr: "cannot span processes"},
		{name: "mem cluster error", spec: "mem", opts: Options{Mem: &fakeCluster{err: boom}}, is: boom, wantErr: "fabric mem: node 7: boom"},
		{name: "net without peers", spec: "net:127.0.0.1:0", is: ErrBadSpec, wantErr: "needs a peers file"},
		{name: "bad", spec: "tcp:1", is: ErrBadSpec, wantErr: "unknown backend"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nic, err := Open(tc.spec, 7, tc.opts)
			if err == nil {
				nic.Close()
				t.Fatalf("Open(%q) succeeded, want error", tc.spec)
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Open(%q) error %q (is %v: %v), want one containing %q", tc.spec, err, tc.is, errors.Is(err, tc.is), tc.wantErr)
			}
		})
	}
}

// TestOpenOFIWithoutTag: a build without the ofi tag refuses ofi specs
// with an error that names the tag (the tagged build runs the real
// backend in fabric/ofi and integration/ofi_test.go).
func TestOpenOFIWithoutTag(t *testing.T) {
	if ofi.Built {
		t.Skip("built with -tags ofi: the libfabric backend is present")
	}
	nic, err := Open("ofi:tcp", 7, Options{})
	if err == nil {
		nic.Close()
		t.Fatal("ofi:tcp opened in a build without the ofi tag")
	}
	if !errors.Is(err, ofi.ErrNotBuilt) || !strings.Contains(err.Error(), "-tags ofi") {
		t.Fatalf("error %q, want ErrNotBuilt naming -tags ofi", err)
	}
}

func TestOpenMemUsesCluster(t *testing.T) {
	c := &fakeCluster{err: errors.New("stop here")}
	_, _ = Open("mem", 3, Options{Mem: c})
	if len(c.asked) != 1 || c.asked[0] != 3 {
		t.Fatalf("cluster asked for %v, want [3]", c.asked)
	}
}
