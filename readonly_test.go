package chameleon_test

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/trace"
)

// rig is a small Engine on the host backend with helpers to run ops,
// write tensors from a kernel and check their bytes inside an op.
type rig struct {
	t   *testing.T
	dev *host.Device
	eng *chameleon.Engine
	it  *chameleon.Iteration
}

func newRig(t *testing.T, limit int64, opts ...chameleon.Option) *rig {
	t.Helper()
	dev, err := host.New(limit)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	eng, err := chameleon.New(dev, append([]chameleon.Option{chameleon.WithMemoryLimit(limit)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close() })
	return &rig{t: t, dev: dev, eng: eng}
}

func (r *rig) tensor(size int64, kind chameleon.Kind) *chameleon.Tensor {
	r.t.Helper()
	x, err := r.eng.NewTensor(size, kind, "u8", []int64{size})
	require.NoError(r.t, err)
	return x
}

// op runs one op: body runs between Before and After.
func (r *rig) op(name string, in, out []*chameleon.Tensor, body func()) error {
	o := &chameleon.Op{Name: name, Module: name, Phase: trace.PhaseForward, In: in, Out: out}
	if err := r.it.Before(o); err != nil {
		return err
	}
	if body != nil {
		body()
	}
	return r.it.After(o)
}

// write queues a kernel that writes b into x (inside an op listing x).
func (r *rig) write(x *chameleon.Tensor, b []byte) {
	ptr, n := x.Ptr(), x.Size()
	require.NoError(r.t, r.dev.Launch(r.eng.ComputeStream(), func() { copy(r.dev.Bytes(ptr, n), b) }))
}

// check reads x back (inside an op listing x) and compares every byte.
func (r *rig) check(x *chameleon.Tensor, want []byte, what string) {
	r.t.Helper()
	got := make([]byte, x.Size())
	require.NoError(r.t, r.dev.ReadDevice(got, x.Ptr()))
	require.True(r.t, bytes.Equal(want, got), "%s: tensor %d bytes differ", what, x.ID())
}

func randomBytes(seed uint64, n int64) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestFrozenFillStreamsWithoutCopyOut: weights twice the limit, set by
// Fill, are read in turn: each comes back with one copy in, leaves with no
// copy out, and reads its filled bytes every time.
func TestFrozenFillStreamsWithoutCopyOut(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 64*kib)
	ws := make([]*chameleon.Tensor, 4)
	want := make([][]byte, len(ws))
	for i := range ws {
		ws[i] = r.tensor(32*kib, chameleon.Frozen)
		want[i] = randomBytes(uint64(i), 32*kib)
		require.NoError(t, r.eng.Fill(ws[i], want[i]))
	}
	st := r.eng.Stats()
	assert.Zero(t, st.SwapsOut, "Fill copies nothing out")
	assert.Equal(t, int64(0), st.DeviceBytes, "Fill leaves the weights on the host")
	for range 3 {
		r.it = r.eng.Begin()
		for i, w := range ws {
			require.NoError(t, r.op("read", []*chameleon.Tensor{w}, nil, func() { r.check(w, want[i], "weight") }))
		}
		r.it.End()
	}
	st = r.eng.Stats()
	assert.Zero(t, st.SwappedOutBytes, "a frozen weight is never copied out")
	assert.Equal(t, st.SwapsOut, st.KeptEvictions)
	assert.Positive(t, st.KeptEvictions)
	assert.Equal(t, int64(12*32*kib), st.SwappedInBytes, "one copy in per use")
	assert.LessOrEqual(t, st.PeakDeviceBytes, int64(64*kib))

	// Written once: a second Fill, and an op that writes it, are refused.
	err := r.eng.Fill(ws[0], want[0])
	assert.ErrorContains(t, err, "Frozen")
	r.it = r.eng.Begin()
	err = r.op("update", []*chameleon.Tensor{ws[1]}, []*chameleon.Tensor{ws[1]}, nil)
	require.Error(t, err)
	assert.ErrorContains(t, err, "op 0 (update)")
	assert.ErrorContains(t, err, "Frozen")
	assert.Contains(t, err.Error(), "tensor 1 ")
	require.NoError(t, r.op("read", []*chameleon.Tensor{ws[1]}, nil, func() { r.check(ws[1], want[1], "after the refused write") }))
	r.it.End()
}

// TestFrozenFirstOpWrites: without Fill, the first op that lists a Frozen
// tensor in Out sets its bytes; its first swap-out copies them, no later
// one does, and a read before any write is refused.
func TestFrozenFirstOpWrites(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 64*kib)
	w := r.tensor(32*kib, chameleon.Frozen)
	want := randomBytes(3, 32*kib)
	pressure := func() {
		a := r.tensor(48*kib, chameleon.Activation)
		require.NoError(t, r.op("fill", nil, []*chameleon.Tensor{a}, nil))
		require.NoError(t, r.eng.Release(a))
	}
	r.it = r.eng.Begin()
	err := r.op("early", []*chameleon.Tensor{w}, nil, nil)
	assert.ErrorContains(t, err, "never written")
	require.NoError(t, r.op("init", nil, []*chameleon.Tensor{w}, func() { r.write(w, want) }))
	pressure()
	st := r.eng.Stats()
	assert.Equal(t, int64(32*kib), st.SwappedOutBytes, "the first swap-out copies")
	for range 3 {
		require.NoError(t, r.op("read", []*chameleon.Tensor{w}, nil, func() { r.check(w, want, "weight") }))
		pressure()
	}
	st = r.eng.Stats()
	assert.Equal(t, int64(32*kib), st.SwappedOutBytes, "no later one does")
	assert.Equal(t, int64(3), st.KeptEvictions)
	err = r.op("init", nil, []*chameleon.Tensor{w}, nil)
	assert.ErrorContains(t, err, "written already")
	assert.ErrorContains(t, r.eng.Fill(w, want), "written once")
	r.it.End()
}

// TestFillPersistent: a parameter's Fill may come again; each sets the
// bytes its next use reads, whether the tensor was resident, kept or out.
func TestFillPersistent(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 64*kib)
	w := r.tensor(16*kib, chameleon.Persistent)
	r.it = r.eng.Begin()
	for i := range 4 {
		want := randomBytes(uint64(10+i), 16*kib)
		require.NoError(t, r.eng.Fill(w, want))
		require.NoError(t, r.op("read", []*chameleon.Tensor{w}, nil, func() { r.check(w, want, "filled") }))
		if i == 1 {
			require.NoError(t, r.eng.Evict(w)) // off the device, with a kept copy
		}
		if i == 2 {
			require.NoError(t, r.eng.Evict(w))
			require.NoError(t, r.eng.Prefetch(w)) // arriving
		}
	}
	// An op's write, then a Fill: the Fill wins.
	want := randomBytes(20, 16*kib)
	require.NoError(t, r.op("write", nil, []*chameleon.Tensor{w}, func() { r.write(w, randomBytes(21, 16*kib)) }))
	require.NoError(t, r.eng.Fill(w, want))
	require.NoError(t, r.op("read", []*chameleon.Tensor{w}, nil, func() { r.check(w, want, "filled after a write") }))
	r.it.End()
	require.NoError(t, r.eng.Release(w))
	st := r.eng.Stats()
	assert.Zero(t, st.HostBytes, "no pinned buffer is lost")
	assert.Zero(t, st.DeviceBytes)
}

func TestFillMisuse(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 64*kib)
	other := newRig(t, 64*kib)
	a := r.tensor(kib, chameleon.Activation)
	w := r.tensor(kib, chameleon.Frozen)
	assert.ErrorContains(t, r.eng.Fill(nil, nil), "nil")
	assert.ErrorContains(t, r.eng.Fill(a, make([]byte, kib)), "activation")
	assert.ErrorContains(t, r.eng.Fill(w, make([]byte, kib-1)), "1023 bytes given")
	assert.ErrorContains(t, other.eng.Fill(w, make([]byte, kib)), "another Engine")
	r.it = r.eng.Begin()
	require.NoError(t, r.op("init", nil, []*chameleon.Tensor{w}, func() {
		assert.ErrorContains(t, r.eng.Fill(w, make([]byte, kib)), "")
	}))
	p := r.tensor(kib, chameleon.Persistent)
	require.NoError(t, r.op("use", []*chameleon.Tensor{p}, nil, func() {
		assert.ErrorContains(t, r.eng.Fill(p, make([]byte, kib)), "op under way")
	}))
	r.it.End()
	require.NoError(t, r.eng.Release(p))
	assert.ErrorContains(t, r.eng.Fill(p, make([]byte, kib)), "released")
	require.NoError(t, r.eng.Close())
	assert.ErrorIs(t, r.eng.Fill(w, make([]byte, kib)), chameleon.ErrClosed)
}

// TestFrozenInProfileAndPolicyFile: the Engine's profile records a Frozen
// tensor as a parameter marked frozen, and the policy file carries it: a
// policy saved and loaded again binds the same Frozen tensor.
func TestFrozenInProfileAndPolicyFile(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 112*kib, chameleon.WithDetection(quick()), chameleon.WithMinSwapBytes(1))
	ws := make([]*chameleon.Tensor, 4)
	want := make([][]byte, len(ws))
	for i := range ws {
		ws[i] = r.tensor(32*kib, chameleon.Frozen)
		want[i] = randomBytes(uint64(30+i), 32*kib)
		require.NoError(t, r.eng.Fill(ws[i], want[i]))
	}
	var planned *chameleon.Result
	for range 6 {
		// Each weight is read on the way down and again on the way up:
		// idle in between, where the plan may send it out.
		r.it = r.eng.Begin()
		for _, i := range []int{0, 1, 2, 3, 3, 2, 1, 0} {
			w := ws[i]
			out := r.tensor(kib, chameleon.Activation)
			require.NoError(t, r.op("layer", []*chameleon.Tensor{w}, []*chameleon.Tensor{out}, func() { r.check(w, want[i], "weight") }))
			require.NoError(t, r.eng.Release(out))
		}
		res := r.it.End()
		if res.Plan != nil && planned == nil {
			planned = &res
		}
	}
	require.NotNil(t, planned, "the Engine profiled and planned")
	require.NotNil(t, planned.Plan.Model)
	for _, w := range ws {
		tt := planned.Plan.Model.Iter.Tensors[w.ID()]
		require.NotNil(t, tt)
		assert.Equal(t, trace.KindParam, tt.Kind)
		assert.True(t, tt.Frozen, "tensor %d", w.ID())
	}
	assert.Zero(t, r.eng.Stats().SwappedOutBytes)
	require.NoError(t, planned.PlanError)
	var buf bytes.Buffer
	require.NoError(t, r.eng.SavePolicies(&buf))
	assert.Contains(t, buf.String(), `"kind":"frozen_parameter"`)
	assert.Contains(t, buf.String(), `"frozen":true`)
	// A fresh Engine with the same tensors loads it, and its swaps bind
	// the same Frozen tensors: they run as planned, copying nothing out.
	r2 := newRig(t, 112*kib, chameleon.WithDetection(quick()), chameleon.WithMinSwapBytes(1))
	ws2 := make([]*chameleon.Tensor, len(ws))
	for i := range ws {
		ws2[i] = r2.tensor(32*kib, chameleon.Frozen)
		require.NoError(t, r2.eng.Fill(ws2[i], want[i]))
	}
	require.NoError(t, r2.eng.LoadPolicies(bytes.NewReader(buf.Bytes()), "saved"))
	require.Equal(t, 1, r2.eng.CachedPolicies())
	var matched int
	for range 4 {
		r2.it = r2.eng.Begin()
		for _, i := range []int{0, 1, 2, 3, 3, 2, 1, 0} {
			w := ws2[i]
			out := r2.tensor(kib, chameleon.Activation)
			require.NoError(t, r2.op("layer", []*chameleon.Tensor{w}, []*chameleon.Tensor{out}, func() { r2.check(w, want[i], "weight") }))
			require.NoError(t, r2.eng.Release(out))
		}
		res := r2.it.End()
		matched = max(matched, res.Matched)
	}
	assert.Positive(t, matched, "the loaded policy bound the Frozen tensors")
	assert.Zero(t, r2.eng.Stats().SwappedOutBytes)

	// The decoder stays strict: frozen only on a parameter, kinds by name.
	bad := strings.Replace(buf.String(), `"kind":1,"dtype":0,"shape":[32768],"ptr":0,"frozen":true`, `"kind":2,"dtype":0,"shape":[32768],"ptr":0,"frozen":true`, 1)
	require.NotEqual(t, buf.String(), bad)
	err := r2.eng.LoadPolicies(strings.NewReader(bad), "bad.json")
	assert.ErrorContains(t, err, "bad.json: policies[0].profile.tensors[0].frozen: true on a tensor of kind 2")
	bad = strings.Replace(buf.String(), `"frozen_parameter"`, `"frozen"`, 1)
	err = r2.eng.LoadPolicies(strings.NewReader(bad), "bad.json")
	assert.ErrorContains(t, err, `policies[0].tensors[0].kind: "frozen": want`)
}
