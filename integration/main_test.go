package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
)

// TestMain doubles as a tiny TCP sender/receiver: with EXNT_HELPER set the
// test binary, re-executed inside a namespace, moves bytes and prints
// their SHA-256, so a transfer over exn0 is checked by content.
func TestMain(m *testing.M) {
	// Roles of the re-executed test binary (each exits).
	if role := os.Getenv("EXNT_ATTACK"); role != "" {
		attackRole(role) // TestSafetyAttack
	}
	if mode := os.Getenv("EXNT_CTL_DIE"); mode != "" {
		ctlDie(mode) // TestSafetyControl
	}
	if h := os.Getenv("EXNT_HELPER"); h != "" {
		if err := helper(h, os.Getenv("EXNT_ADDR")); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", h, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	nstest.Main(m)
}

// helper runs "recv" (listen on addr, take one connection, read to EOF)
// or "send" (connect to addr, write EXNT_SIZE pseudo-random bytes from
// EXNT_SEED) and prints "sha256=<hex> bytes=<n>".
func helper(mode, addr string) error {
	h := sha256.New()
	var n int64
	switch mode {
	case "recv":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		fmt.Println("listening")
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		defer c.Close()
		if n, err = io.Copy(h, c); err != nil {
			return fmt.Errorf("read: %w", err)
		}
	case "send":
		size, err := strconv.ParseInt(os.Getenv("EXNT_SIZE"), 10, 64)
		if err != nil {
			return fmt.Errorf("EXNT_SIZE: %w", err)
		}
		seed, _ := strconv.ParseUint(os.Getenv("EXNT_SEED"), 10, 64)
		var c net.Conn
		for deadline := time.Now().Add(5 * time.Second); ; {
			if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("dial: %w", err)
		}
		src := io.LimitReader(rand.NewChaCha8(seedBytes(seed)), size)
		if n, err = io.Copy(io.MultiWriter(c, h), src); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return fmt.Errorf("close write: %w", err)
		}
		// Wait for the receiver's close so every byte was taken.
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	default:
		return fmt.Errorf("unknown mode")
	}
	fmt.Printf("sha256=%s bytes=%d\n", hex.EncodeToString(h.Sum(nil)), n)
	return nil
}

func seedBytes(s uint64) (b [32]byte) {
	for i := range 8 {
		b[i] = byte(s >> (8 * i))
	}
	return b
}
