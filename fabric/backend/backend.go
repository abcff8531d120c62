package backend

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabnet"
	"github.com/exn-project/exn/fabric/peers"
	"github.com/exn-project/exn/fabric/shm"
)

// Kind names a backend.
type Kind string

const (
	Mem Kind = "mem"
	SHM Kind = "shm"
	Net Kind = "net"
	OFI Kind = "ofi"
)

// ErrUnavailable: the spec names a real backend that this build does not
// contain. Open returns an *UnavailableError, which matches it under
// errors.Is.
var ErrUnavailable = errors.New("fabric backend not available in this build")

// UnavailableError names the backend that is missing from this build.
type UnavailableError struct{ Kind Kind }

func (e *UnavailableError) Error() string {
	return "fabric backend " + string(e.Kind) + " not available in this build"
}

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// ErrBadSpec: the spec does not parse.
var ErrBadSpec = errors.New("bad fabric spec")

// Spec is a parsed backend spec.
type Spec struct {
	Kind Kind
	// Arg is what follows the colon: the shm fabric name, the net listen
	// address or the ofi provider. Empty for mem.
	Arg string
}

func (s Spec) String() string {
	if s.Arg == "" {
		return string(s.Kind)
	}
	return string(s.Kind) + ":" + s.Arg
}

// Cluster is what the mem backend needs: something that creates the NIC of
// a node in a shared in-process fabric. *mem.Cluster satisfies it.
type Cluster interface {
	NewNIC(fabric.NodeID) (fabric.NIC, error)
}

// Options tune Open.
type Options struct {
	// Mem is the in-process cluster a "mem" spec joins. Without it a "mem"
	// spec fails: an in-process fabric cannot span processes, so a NIC of
	// its own would have no peers.
	Mem Cluster
	// SHM are extra options for the shm backend (slots, directory, ...).
	SHM []shm.Option
	// Peers maps node IDs to addresses: required by net (the peers file,
	// docs/design.md "Commands"), ignored by mem and shm.
	Peers []peers.Peer
	// Logger receives backend log lines; nil means slog.Default().
	Logger *slog.Logger
	// Liveness is net's way of finding dead peers (fabnet.Config.Liveness:
	// "swim", "heartbeat"; empty: its default). On ofi, "swim" or empty
	// runs membership beside the provider when there is a peers file
	// (ofi.Config.Liveness) and "heartbeat" keeps the backend's own
	// liveness. mem and shm ignore it.
	Liveness string
	// Sessions is when net makes its sessions (fabnet.Config.Sessions:
	// "lazy", "eager"; empty: its default). Ignored by the others.
	Sessions string
}

// Parse parses a backend spec. It checks the syntax of every kind,
// including kinds this build cannot open.
func Parse(spec string) (Spec, error) {
	kind, arg, hasArg := strings.Cut(spec, ":")
	s := Spec{Kind: Kind(kind), Arg: arg}
	switch s.Kind {
	case Mem:
		if hasArg {
			return Spec{}, fmt.Errorf("%q: mem takes no argument: %w", spec, ErrBadSpec)
		}
	case SHM:
		if arg == "" {
			return Spec{}, fmt.Errorf("%q: want shm:NAME: %w", spec, ErrBadSpec)
		}
		if err := checkName(arg); err != nil {
			return Spec{}, fmt.Errorf("%q: %w", spec, err)
		}
	case Net:
		if arg == "" {
			return Spec{}, fmt.Errorf("%q: want net:LISTEN_ADDR: %w", spec, ErrBadSpec)
		}
	case OFI:
		if arg == "" {
			return Spec{}, fmt.Errorf("%q: want ofi:PROVIDER: %w", spec, ErrBadSpec)
		}
	case "":
		return Spec{}, fmt.Errorf("empty spec: want mem, shm:NAME, net:LISTEN_ADDR or ofi:PROVIDER: %w", ErrBadSpec)
	default:
		return Spec{}, fmt.Errorf("%q: unknown backend %q (want mem, shm, net or ofi): %w", spec, kind, ErrBadSpec)
	}
	return s, nil
}

// checkName applies the shm backend's rule for fabric names (letters,
// digits, '_' and '.', at most 64 bytes), so a bad name is a usage error
// before anything is opened.
func checkName(name string) error {
	if len(name) > 64 {
		return fmt.Errorf("shm name %d bytes long, at most 64: %w", len(name), ErrBadSpec)
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.':
		default:
			return fmt.Errorf("shm name %q: character %q not allowed (letters, digits, '_' and '.'): %w", name, r, ErrBadSpec)
		}
	}
	if name[0] == '.' {
		return fmt.Errorf("shm name %q starts with a dot: %w", name, ErrBadSpec)
	}
	return nil
}

// Open parses spec and opens node's NIC on that fabric.
func Open(spec string, node fabric.NodeID, opts Options) (fabric.NIC, error) {
	s, err := Parse(spec)
	if err != nil {
		return nil, err
	}
	return OpenSpec(s, node, opts)
}

// OpenSpec opens node's NIC on the fabric s names.
func OpenSpec(s Spec, node fabric.NodeID, opts Options) (fabric.NIC, error) {
	switch s.Kind {
	case Mem:
		if opts.Mem == nil {
			return nil, fmt.Errorf("fabric mem: the in-process backend cannot span processes; "+
				"use shm:NAME for nodes on one host (mem needs an in-process cluster in backend.Options.Mem): %w", ErrBadSpec)
		}
		nic, err := opts.Mem.NewNIC(node)
		if err != nil {
			return nil, fmt.Errorf("fabric mem: node %d: %w", node, err)
		}
		return nic, nil
	case SHM:
		sopts := opts.SHM
		if opts.Logger != nil {
			sopts = append([]shm.Option{shm.WithLogger(opts.Logger)}, sopts...)
		}
		nic, err := shm.Open(s.Arg, node, sopts...)
		if err != nil {
			return nil, fmt.Errorf("fabric %s: node %d: %w", s, node, err)
		}
		return nic, nil
	case Net:
		if len(opts.Peers) == 0 {
			return nil, fmt.Errorf("fabric %s: node %d: the net backend needs a peers file (--peers): %w", s, node, ErrBadSpec)
		}
		nic, err := fabnet.Open(fabnet.Config{
			Node:     node,
			Listen:   s.Arg,
			Peers:    fabnet.PeerAddrs(opts.Peers, ""),
			Logger:   opts.Logger,
			Liveness: fabnet.Liveness(opts.Liveness),
			Sessions: fabnet.Sessions(opts.Sessions),
		})
		if err != nil {
			return nil, fmt.Errorf("fabric %s: node %d: %w", s, node, err)
		}
		return nic, nil
	case OFI:
		return openOFI(s, node, opts)
	}
	return nil, fmt.Errorf("fabric %q: unknown backend: %w", s.Kind, ErrBadSpec)
}
