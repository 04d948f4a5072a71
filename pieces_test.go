package chameleon_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
)

// stepper is a small training loop on the host backend whose optimizer
// step lists every parameter, gradient and optimizer state: with real
// bytes, a shadow of each tensor in Go memory, and every read checked.
type stepper struct {
	t            *testing.T
	dev          *host.Device
	eng          *chameleon.Engine
	params, m, v []*chameleon.Tensor
	want         map[*chameleon.Tensor][]byte
	size         int64
	// recompute: the forward's ops can run again (Op.Recompute).
	recompute bool
	// actX: an activation is actX times a parameter's size (0: 1).
	actX int
	// made holds the activations of the iteration under way not released
	// yet: a failed step releases them, as a host's deferred cleanup does.
	made map[*chameleon.Tensor]bool
	// skip: the step ends after the backward, with no update (a mixed
	// precision step whose gradients overflowed).
	skip bool
}

func newStepper(t *testing.T, n int, size, limit int64) *stepper {
	dev, err := host.New(2 * limit)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	return newStepperOn(t, dev, dev, n, size, chameleon.WithMemoryLimit(limit), chameleon.WithDetection(quick()), chameleon.WithMeasuredTimes(false))
}

// newStepperOn is a stepper whose Engine runs on on (hd itself, or a
// device wrapping it), reading and writing bytes through hd.
func newStepperOn(t *testing.T, hd *host.Device, on device.Device, n int, size int64, opts ...chameleon.Option) *stepper {
	eng, err := chameleon.New(on, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close() })
	s := &stepper{t: t, dev: hd, eng: eng, want: map[*chameleon.Tensor][]byte{}, size: size, made: map[*chameleon.Tensor]bool{}}
	for i := range n {
		for _, l := range []*[]*chameleon.Tensor{&s.params, &s.m, &s.v} {
			kind := chameleon.Persistent
			if l != &s.params {
				kind = chameleon.OptimizerState
			}
			x, err := eng.NewTensor(size, kind, "float32", []int64{size / 4})
			require.NoError(t, err)
			*l = append(*l, x)
			s.write(x, bytesOf(size, byte(i), byte(len(*l))))
		}
	}
	return s
}

func bytesOf(n int64, a, b byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i)*a ^ b
	}
	return p
}

// write sets x's bytes (inside an op that lists x, or before any op).
func (s *stepper) write(x *chameleon.Tensor, b []byte) {
	require.NoError(s.t, s.dev.WriteDevice(x.Ptr(), b))
	s.want[x] = b
}

// read returns x's bytes, checking them against what was written last.
func (s *stepper) read(x *chameleon.Tensor) []byte {
	got := make([]byte, x.Size())
	require.NoError(s.t, s.dev.ReadDevice(got, x.Ptr()))
	require.Equal(s.t, s.want[x], got, "a tensor came back with other bytes")
	return got
}

// step runs one iteration: a forward that reads each parameter, a backward
// that makes each gradient, and the optimizer step, in pieces or whole.
func (s *stepper) step(iter int, pieces bool) (res chameleon.Result, err error) {
	it := s.eng.Begin()
	defer func() {
		res = it.End()
		for x := range s.made {
			if rerr := s.eng.Release(x); rerr != nil && err == nil {
				err = rerr
			}
		}
		clear(s.made)
	}()
	return res, s.ops(it, iter, pieces)
}

// newAct makes an activation of the iteration under way, x parameters'
// size.
func (s *stepper) newAct(x int) (*chameleon.Tensor, error) {
	a, err := s.eng.NewTensor(s.size*int64(max(x, 1)), chameleon.Activation, "float32", nil)
	if err == nil {
		s.made[a] = true
	}
	return a, err
}

// release releases an activation of the iteration under way.
func (s *stepper) release(a *chameleon.Tensor) error {
	delete(s.made, a)
	return s.eng.Release(a)
}

func (s *stepper) ops(it *chameleon.Iteration, iter int, pieces bool) error {
	n := len(s.params)
	acts := make([]*chameleon.Tensor, n)
	for i, p := range s.params {
		op := &chameleon.Op{Name: "fwd", In: []*chameleon.Tensor{p}}
		a, err := s.newAct(s.actX)
		if err != nil {
			return err
		}
		op.Out = []*chameleon.Tensor{a}
		fwd := func() error {
			b := s.read(p)
			for j := range b {
				b[j] ^= byte(iter)
			}
			s.write(a, bytes.Repeat(b, max(s.actX, 1)))
			return nil
		}
		if s.recompute {
			op.Recompute = fwd
		}
		if err := it.Before(op); err != nil {
			return err
		}
		if err := fwd(); err != nil {
			return err
		}
		acts[i] = a
		if err := it.After(op); err != nil {
			return err
		}
	}
	grads := make([]*chameleon.Tensor, n)
	for i := n - 1; i >= 0; i-- {
		g, err := s.newAct(1)
		if err != nil {
			return err
		}
		op := &chameleon.Op{Name: "bwd", In: []*chameleon.Tensor{acts[i]}, Out: []*chameleon.Tensor{g}}
		if err := it.Before(op); err != nil {
			return err
		}
		b := s.read(acts[i])[:s.size]
		for j := range b {
			b[j] = b[j]*3 + 1
		}
		s.write(g, b)
		grads[i] = g
		if err := it.After(op); err != nil {
			return err
		}
		if err := s.release(acts[i]); err != nil {
			return err
		}
	}
	if s.skip {
		for _, g := range grads {
			if err := s.release(g); err != nil {
				return err
			}
		}
		return nil
	}
	update := func(i int) error {
		p, g, m, v := s.read(s.params[i]), s.read(grads[i]), s.read(s.m[i]), s.read(s.v[i])
		for j := range p {
			m[j] = m[j]/2 + g[j]/2
			v[j] ^= g[j]
			p[j] -= m[j] ^ v[j]
		}
		s.write(s.params[i], p)
		s.write(s.m[i], m)
		s.write(s.v[i], v)
		return nil
	}
	op := &chameleon.Op{Name: "aten::_fused_adamw_"}
	if pieces {
		ps := make([]chameleon.Piece, n)
		for i := range n {
			ps[i] = chameleon.Piece{In: []*chameleon.Tensor{s.params[i], grads[i], s.m[i], s.v[i]}, Out: []*chameleon.Tensor{s.params[i], s.m[i], s.v[i]}}
		}
		if err := it.Pieces(op, ps, update); err != nil {
			return err
		}
	} else {
		for i := range n {
			op.In = append(op.In, s.params[i], grads[i], s.m[i], s.v[i])
			op.Out = append(op.Out, s.params[i], s.m[i], s.v[i])
		}
		if err := it.Before(op); err != nil {
			return err
		}
		for i := range n {
			if err := update(i); err != nil {
				return err
			}
		}
		if err := it.After(op); err != nil {
			return err
		}
	}
	for _, g := range grads {
		if err := s.release(g); err != nil {
			return err
		}
	}
	return nil
}

// TestPiecesRunBelowTheWholeOp: an optimizer step that lists 4 x 8
// tensors cannot run under a limit of 2.5 of them per parameter; run in
// pieces it does, planned (STABLE, swaps in force), every byte as written.
func TestPiecesRunBelowTheWholeOp(t *testing.T) {
	const n, size = 8, 64 << 10
	limit := int64(n * size * 5 / 2)
	whole := newStepper(t, n, size, limit)
	_, err := whole.step(0, false)
	require.Error(t, err, "the whole step lists more than the limit")
	require.True(t, errors.Is(err, chameleon.ErrOutOfMemory), "%v", err)

	s := newStepper(t, n, size, limit)
	var last chameleon.Result
	for iter := range 12 {
		last, err = s.step(iter, true)
		require.NoError(t, err, "iteration %d", iter)
	}
	st := s.eng.Stats()
	require.Equal(t, "STABLE", last.Stage.String())
	require.Positive(t, st.Replans, "a policy was planned for the pieces")
	require.Positive(t, last.SwapsOut, "the policy swaps")
	require.Zero(t, last.Evictions, "as planned: no forced eviction")
	require.Zero(t, last.OnDemand)
	require.LessOrEqual(t, st.PeakDeviceBytes, limit)
}

// TestCarriedAfterASkippedStep: a step that skips the update (its
// gradients overflowed) runs under the real steps' policy, which swaps the
// weights out after the forward and brings them back for the update; the
// step ends before it, leaving them on the host. The next step's forward
// reads them: the Engine carries their copies back into it
// (Stats.Carried), started at its first op, every byte as written.
func TestCarriedAfterASkippedStep(t *testing.T) {
	const n, size = 8, 64 << 10
	s := newStepper(t, n, size, int64(n*size*5/2))
	var last chameleon.Result
	var err error
	for iter := range 12 {
		last, err = s.step(iter, true)
		require.NoError(t, err, "iteration %d", iter)
	}
	require.Equal(t, "STABLE", last.Stage.String())
	require.Positive(t, last.SwapsOut)
	s.skip = true
	skipped, err := s.step(12, true)
	require.NoError(t, err)
	require.Positive(t, skipped.SwapsOut, "the real steps' policy ran the skipped step")
	s.skip = false
	carried := s.eng.Stats().Carried
	next, err := s.step(13, true)
	require.NoError(t, err)
	got := s.eng.Stats().Carried - carried
	t.Logf("carried into the next step: %d; on demand there: %d", got, next.OnDemand)
	require.Positive(t, got, "the weights left on the host came back ahead of their use")
	for iter := 14; iter < 16; iter++ {
		_, err = s.step(iter, true)
		require.NoError(t, err, "iteration %d", iter)
	}
}

// TestPiecesRefuses: what a piecewise op cannot be.
func TestPiecesRefuses(t *testing.T) {
	s := newStepper(t, 1, 1024, 1<<20)
	it := s.eng.Begin()
	defer it.End()
	err := it.Pieces(&chameleon.Op{Name: "x", Recompute: func() error { return nil }}, []chameleon.Piece{{}}, func(int) error { return nil })
	require.ErrorContains(t, err, "no Recompute")
	require.ErrorContains(t, it.Pieces(&chameleon.Op{Name: "x"}, []chameleon.Piece{{}}, nil), "nil run")
	boom := errors.New("boom")
	require.ErrorIs(t, it.Pieces(&chameleon.Op{Name: "x"}, []chameleon.Piece{{In: s.params}}, func(int) error { return boom }), boom)
}
