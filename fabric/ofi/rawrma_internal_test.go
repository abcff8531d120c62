//go:build ofi && cgo

package ofi

import (
	"fmt"
	"testing"

	"github.com/exn-project/exn/fabric/internal/localq"
)

// BenchmarkRawRMA is the baseline for exn's RMA benchmarks on ofi:shm
// (BenchmarkFabricSHM/RMA/*): a plain loop of fi_writemsg/fi_readmsg of
// one buffer between two endpoints, each followed by reading its
// completion, with nothing of exn around it (no regions table, no
// notifications, no region query). The target endpoint polls its CQ
// meanwhile, as fabtests' rma_bw does. Compare the MB/s. "put" is
// fi_writemsg with the provider's default completion, "put-dc" with
// FI_DELIVERY_COMPLETE, which exn asks for on shm (see needDC in rma.go).
func BenchmarkRawRMA(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 8 << 20} {
		for _, c := range []struct {
			op        string
			write, dc bool
		}{{"get", false, false}, {"put", true, false}, {"put-dc", true, true}} {
			b.Run(fmt.Sprintf("shm/%s-%dKiB", c.op, size>>10), func(b *testing.B) { benchRawRMA(b, "shm", c.write, c.dc, size) })
		}
	}
}

func benchRawRMA(b *testing.B, prov string, write, dc bool, size int) {
	open := func() *fab {
		in, err := getinfo(prov, "", "", capMsg|capRMA|capSource, true, orderSAS)
		if err != nil {
			b.Fatal(err)
		}
		f, err := openFab(in, 1024, 16)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(f.close)
		return f
	}
	req, tgt := open(), open()
	mem := func(f *fab, key uint64) (cmem, mr) {
		m, err := mmapMem(size)
		if err != nil {
			b.Fatal(err)
		}
		r, err := f.mrReg(m, regionAccess, key)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.close(); m.free() })
		return m, r
	}
	lm, lr := mem(req, 1)
	rm, rr := mem(tgt, 2)
	// Touch both buffers as fabrictest.Bench does for exn's regions:
	// untouched anonymous pages all map the kernel's zero page, and a
	// copy out of one cache-hot page would flatter the baseline.
	fillPattern(lm.bytes(), 1)
	fillPattern(rm.bytes(), 2)
	name, err := tgt.name()
	if err != nil {
		b.Fatal(err)
	}
	dest, err := req.avInsert(name)
	if err != nil {
		b.Fatal(err)
	}
	raddr := uint64(0)
	if req.mrMode()&mrVirtAddr != 0 {
		raddr = rm.addr()
	}
	vec := newRMAVecs(1)
	defer freeRMAVecs(vec)
	vec[0].set(0, lm.p, raddr, size)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the target's progress
		defer close(done)
		bt, err := newCQBatch(8)
		if err != nil {
			return
		}
		defer bt.free()
		for !localq.ClosedChan(stop) {
			tgt.poll(bt, bt.stage, nil)
		}
	}()
	defer func() { close(stop); <-done }()
	bq, err := newCQBatch(8)
	if err != nil {
		b.Fatal(err)
	}
	defer bq.free()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for {
			err := req.rma(write, dc, &vec[0], 1, lr.desc, dest, rr.key, mkctx(ctxRMA, 0))
			if err == nil {
				break
			}
			if !isAgain(err) {
				b.Fatal(err)
			}
			req.poll(bq, bq.stage, nil)
		}
		for {
			k, err := req.poll(bq, bq.stage, nil)
			if err != nil {
				e, _ := req.cqReadErr(bq)
				b.Fatalf("rma: %v %s", err, e.detail)
			}
			if k > 0 {
				break
			}
		}
	}
}

// fillPattern writes a non-zero pattern seeded by seed into b.
func fillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i)
	}
}
