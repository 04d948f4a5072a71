package chameleon_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// workload is a random op graph: op i reads some earlier outputs (or the
// weights) and writes one fresh tensor.
type workload struct {
	weights []int64 // sizes
	ops     []wop
}

type wop struct {
	name   string
	module string
	in     []int // >= 0: output of that op; < 0: weight -1-w
	size   int64
	phase  trace.Phase
}

// footprint is the workload's peak of live bytes without swapping, and the
// largest working set of one op (its inputs, its output and the weights,
// which the limit must hold: they cannot all move out).
func (w workload) footprint() (peak, working int64) {
	last := make([]int, len(w.ops))
	for i, o := range w.ops {
		last[i] = i
		for _, j := range o.in {
			if j >= 0 {
				last[j] = max(last[j], i)
			}
		}
	}
	var weights int64
	for _, s := range w.weights {
		weights += s
	}
	live := weights
	for i, o := range w.ops {
		live += o.size
		peak = max(peak, live)
		ws := weights + o.size
		for _, j := range o.in {
			if j >= 0 {
				ws += w.ops[j].size
			}
		}
		working = max(working, ws)
		for j := range i + 1 {
			if last[j] == i {
				live -= w.ops[j].size
			}
		}
	}
	return peak, working
}

func genWorkload(r *rand.Rand) workload {
	var w workload
	for range 1 + r.IntN(4) {
		w.weights = append(w.weights, int64(1+r.IntN(16))<<10)
	}
	n := 20 + r.IntN(60)
	names := []string{"mm", "add", "mul", "relu", "cat"}
	for i := range n {
		o := wop{name: names[r.IntN(len(names))], module: fmt.Sprintf("layer.%d", i*4/n), size: int64(1+r.IntN(48)) << 10, phase: trace.PhaseForward}
		if i > n/2 {
			o.phase = trace.PhaseBackward
		}
		for range r.IntN(3) {
			if i > 0 && r.IntN(4) > 0 {
				// Mostly recent outputs, sometimes one from far back: the
				// long gaps a planner swaps over.
				j := i - 1 - r.IntN(min(i, 4))
				if r.IntN(5) == 0 {
					j = r.IntN(i)
				}
				o.in = append(o.in, j)
			} else {
				o.in = append(o.in, -1-r.IntN(len(w.weights)))
			}
		}
		w.ops = append(w.ops, o)
	}
	return w
}

// pattern is the contents tensor id has after write number gen.
func pattern(b []byte, id, gen uint64) {
	s := id*0x9E3779B97F4A7C15 ^ gen*0xBF58476D1CE4E5B9 | 1
	for i := range b {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		b[i] = byte(s)
	}
}

// runWorkload drives the Engine through iters iterations of w under limit,
// with every kernel queued on the compute stream (host.Device.Launch), so
// that a missing device-side wait shows as a wrong byte. It returns the
// number of uses that read wrong bytes.
func runWorkload(t *testing.T, w workload, limit int64, iters int) (bad int64, st chameleon.Stats) {
	t.Helper()
	dev, err := host.New(limit)
	require.NoError(t, err)
	defer dev.Close()
	d := seq.DefaultConfig()
	d.M, d.N = 1, 1
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(limit), chameleon.WithDetection(d), chameleon.WithMinSwapBytes(1))
	require.NoError(t, err)
	defer eng.Close()
	cs := eng.ComputeStream()
	var wrong atomic.Int64
	var gen uint64
	type live struct {
		t   *chameleon.Tensor
		id  uint64
		gen uint64
	}
	// kernel reads ins (checking their bytes) and writes out.
	kernel := func(ins []live, out *live) {
		type view struct {
			ptr  uintptr
			n    int64
			want []byte
		}
		var vs []view
		for _, l := range ins {
			want := make([]byte, l.t.Size())
			pattern(want, l.id, l.gen)
			vs = append(vs, view{uintptr(l.t.Ptr()), l.t.Size(), want})
		}
		optr, on, oid, ogen := out.t.Ptr(), out.t.Size(), out.id, out.gen
		require.NoError(t, dev.Launch(cs, func() {
			for _, v := range vs {
				if string(dev.Bytes(devPtr(v.ptr), v.n)) != string(v.want) {
					wrong.Add(1)
				}
			}
			pattern(dev.Bytes(optr, on), oid, ogen)
		}))
	}
	weights := make([]live, len(w.weights))
	for i, size := range w.weights {
		tw, err := eng.NewTensor(size, chameleon.Persistent, "f32", []int64{size / 4})
		require.NoError(t, err)
		gen++
		weights[i] = live{t: tw, id: uint64(1000 + i), gen: gen}
		it := eng.Begin()
		op := &chameleon.Op{Name: "init", Out: []*chameleon.Tensor{tw}}
		require.NoError(t, it.Before(op))
		kernel(nil, &weights[i])
		require.NoError(t, it.After(op))
		it.End()
	}
	last := make([]int, len(w.ops)) // last use of each op's output
	for i, o := range w.ops {
		last[i] = i
		for _, j := range o.in {
			if j >= 0 {
				last[j] = max(last[j], i)
			}
		}
	}
	for range iters {
		it := eng.Begin()
		outs := make([]live, len(w.ops))
		var op chameleon.Op
		for i, o := range w.ops {
			tt, err := eng.NewTensor(o.size, chameleon.Activation, "f32", []int64{o.size / 4})
			require.NoError(t, err)
			gen++
			outs[i] = live{t: tt, id: uint64(i), gen: gen}
			op = chameleon.Op{Name: o.name, Overload: "default", Module: o.module, Phase: o.phase, Out: []*chameleon.Tensor{tt}}
			var ins []live
			for _, j := range o.in {
				l := outs[max(j, 0)]
				if j < 0 {
					l = weights[-1-j]
				}
				ins = append(ins, l)
				op.In = append(op.In, l.t)
			}
			if err := it.Before(&op); err != nil {
				if errors.Is(err, chameleon.ErrOutOfMemory) {
					t.Skipf("op %d's working set does not fit: %v", i, err)
				}
				require.NoError(t, err)
			}
			kernel(ins, &outs[i])
			require.NoError(t, it.After(&op))
			require.NoError(t, eng.CheckOnDevice(), "op %d", i)
			for j := range i + 1 {
				if last[j] == i && outs[j].t != nil {
					require.NoError(t, eng.Release(outs[j].t))
					outs[j].t = nil
				}
			}
		}
		it.End()
	}
	require.NoError(t, dev.SyncStream(cs))
	require.LessOrEqual(t, dev.PeakAllocated(), limit)
	return wrong.Load(), eng.Stats()
}

func devPtr(p uintptr) device.DevPtr { return device.DevPtr(p) }

// TestEngineRandomWorkloads runs random op graphs under limits down to 40%
// of their unlimited footprint, with kernels ordered only by the compute
// stream: every byte an op reads is what the op that wrote it left.
func TestEngineRandomWorkloads(t *testing.T) {
	var swapped int64
	for seed := range uint64(30) {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		w := genWorkload(r)
		peak, working := w.footprint()
		limit := max(peak*int64(40+r.IntN(61))/100, working*3/2)
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			bad, st := runWorkload(t, w, limit, 5)
			require.Zero(t, bad, "uses that read wrong bytes")
			swapped += st.SwappedOutBytes
			t.Logf("limit %d of peak %d: swapped %d bytes out, %d forced, %d planned policies", limit, peak, st.SwappedOutBytes, st.Evictions, st.Replans)
		})
	}
	require.Positive(t, swapped, "the limits must force swaps")
}

// FuzzEngine is TestEngineRandomWorkloads over any seed and limit.
func FuzzEngine(f *testing.F) {
	f.Add(uint64(1), uint8(50))
	f.Add(uint64(7), uint8(90))
	f.Fuzz(func(t *testing.T, seed uint64, pct uint8) {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		w := genWorkload(r)
		peak, working := w.footprint()
		limit := max(peak*int64(20+int(pct)%81)/100, working*3/2)
		if bad, _ := runWorkload(t, w, limit, 3); bad != 0 {
			t.Fatalf("%d uses read wrong bytes", bad)
		}
	})
}
