package main

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/examples/train/compute"
	"github.com/chameleon-go/chameleon/trace"
)

// Model is the shape of the network and of the task.
//
// The task is regression onto a fixed random teacher, y = tanh(x*T1 + c)*T2,
// with x drawn fresh every step from a counter-based generator on the
// device: learnable (a wide enough student fits it), endless, and with no
// host-to-device data upload that would compete with swaps for the link.
//
// The student is a deep residual MLP: h0 = x*Win, then per block
// h' = h + relu(h*W1 + b1)*W2, then pred = h*Wout + bout. A residual stack
// is what large models look like to a swap planner: the same block
// repeated, each keeping its input and hidden activation alive from its
// forward until its backward, so the oldest activations sit idle the
// longest.
type Model struct {
	Layers        int // residual blocks
	Width         int // residual stream width H
	FFN           int // hidden width F of a block
	In, Out       int // input and output features
	TeacherHidden int
	Batch         int
	// LossChunks splits the head and the loss along the batch: chunk c
	// is rows [c*Batch/LossChunks, (c+1)*Batch/LossChunks), its target,
	// prediction and their gradient tensors of their own, so that no op
	// lists the whole batch's predictions (the chunked loss over a
	// language model's logits). 0 or 1: the batch whole.
	LossChunks int
}

// chunks is how many chunks the loss is computed in.
func (m Model) chunks() int { return max(m.LossChunks, 1) }

// chunkRows is chunk c's rows of the batch, [r0, r1).
func (m Model) chunkRows(c int) (r0, r1 int) {
	k := m.chunks()
	return c * m.Batch / k, (c + 1) * m.Batch / k
}

// Validate reports a shape that cannot run.
func (m Model) Validate() error {
	if m.Layers < 1 || m.Width < 1 || m.FFN < 1 || m.In < 1 || m.Out < 1 || m.TeacherHidden < 1 || m.Batch < 1 {
		return fmt.Errorf("model %+v: every size must be at least 1", m)
	}
	if m.LossChunks < 0 || m.LossChunks > m.Batch {
		return fmt.Errorf("model: %d loss chunks for a batch of %d: give 0 (the batch whole) up to the batch", m.LossChunks, m.Batch)
	}
	return nil
}

// ParamBytes is the bytes of the trained parameters (one copy; the
// gradients and momentum buffers are the same size again each).
func (m Model) ParamBytes() int64 {
	n := m.In*m.Width + m.Layers*(m.Width*m.FFN+m.FFN+m.FFN*m.Width) + m.Width*m.Out + m.Out
	return int64(n) * 4
}

// PersistentBytes is parameters, gradients and momentum, plus the teacher.
func (m Model) PersistentBytes() int64 {
	teacher := int64(m.In*m.TeacherHidden+m.TeacherHidden+m.TeacherHidden*m.Out) * 4
	return 3*m.ParamBytes() + teacher
}

// SavedActivationBytes is what the forward keeps for the backward: the
// input and target, each block's input and hidden activation, the final
// stream and the prediction. It is the part of the footprint swapping can
// move; an op's own inputs and outputs must stay.
func (m Model) SavedActivationBytes() int64 {
	b := int64(m.Batch)
	return 4 * b * int64(m.In+m.Out+(m.Layers+1)*m.Width+m.Layers*m.FFN+m.Out)
}

// UpperBoundBytes bounds the device bytes a step can hold at once with no
// swapping: persistent state, saved activations, and a generous allowance
// for the transients of the widest op (each rounded to the allocator's
// block size). It sizes the reservation of an unlimited run.
func (m Model) UpperBoundBytes() int64 {
	b := int64(m.Batch)
	widest := int64(max(m.Width, m.FFN, m.TeacherHidden, m.Out))
	tensors := int64(8 + 2*m.Layers + 3*m.Layers + 8)
	return m.PersistentBytes() + m.SavedActivationBytes() + 6*4*b*widest + tensors*device.BlockSize + 1<<20
}

// param is a trained tensor with its gradient and momentum buffer.
type param struct {
	w, g, m *chameleon.Tensor
	n       int
	module  string // call site of its optimizer op
	reduce  string // call site of its gradient's all-reduce (ranks)
}

type block struct {
	w1, b1, w2 *param
	// call sites, built once so that a step allocates no strings
	fc1, act, fc2, res, bfc2, bfc2x, bact, bb1, bfc1, bres string
}

// net is the model's state in Engine-managed memory.
type net struct {
	m       Model
	eng     *chameleon.Engine
	k       compute.Kernels
	win     *param
	blocks  []block
	wout    *param
	bout    *param
	params  []*param
	t1, tc  *chameleon.Tensor // teacher, not trained
	t2      *chameleon.Tensor
	it      *chameleon.Iteration
	op      chameleon.Op
	seed    uint64
	lossBuf [4]byte
	// the optimizer step's pieces, reused each step
	pieces  []chameleon.Piece
	stepped []*param
	live    []*param // the parameters a step trains

	// phaseSync: wait for the device at the end of the forward and note
	// when (fwdEnd), for Step.Forward.
	phaseSync bool
	fwdEnd    time.Time

	// shapes, shared by every tensor of that shape; shCO per loss chunk
	shBH, shBF, shBO, shBD, shBT, shScalar []int64
	shCO                                   [][]int64
	// recompute: forward ops hand the Engine their kernel to run again.
	recompute bool
	// hoist: each parameter's optimizer piece runs in the backward, as
	// soon as its gradient is final and the backward no longer reads it.
	hoist bool
	// reduce, with data-parallel ranks, averages each gradient and the
	// loss over the ranks (nil: one rank, no such ops); row0 is the first
	// row of the global batch this rank's batch holds.
	reduce Reducer
	row0   int
}

// mix derives independent seeds from the run's seed: one per parameter,
// one per step's batch.
func mix(seed uint64, a, b uint64) uint64 {
	return compute.Hash(compute.Hash(seed, a), b)
}

// newNet allocates every persistent tensor and initializes it on the
// device. Parameters use He-style uniform scales; the second weight of
// each block is scaled down by sqrt(layers) so that the residual stream
// keeps its variance through a deep stack without normalization.
func newNet(eng *chameleon.Engine, k compute.Kernels, m Model, seed uint64) (*net, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	n := &net{m: m, eng: eng, k: k, seed: seed,
		shBH: []int64{int64(m.Batch), int64(m.Width)}, shBF: []int64{int64(m.Batch), int64(m.FFN)},
		shBO: []int64{int64(m.Batch), int64(m.Out)}, shBD: []int64{int64(m.Batch), int64(m.In)},
		shBT: []int64{int64(m.Batch), int64(m.TeacherHidden)}, shScalar: []int64{1}}
	for c := range m.chunks() {
		r0, r1 := m.chunkRows(c)
		n.shCO = append(n.shCO, []int64{int64(r1 - r0), int64(m.Out)})
	}
	var idx uint64
	tensor := func(shape []int64, scale float32) (*chameleon.Tensor, error) {
		size := int64(4)
		for _, d := range shape {
			size *= d
		}
		t, err := eng.NewTensor(size, chameleon.Persistent, "float32", shape)
		if err != nil {
			return nil, err
		}
		idx++
		return t, k.Uniform(t.Ptr(), int(size/4), mix(seed, 1, idx), scale)
	}
	newParam := func(module string, scale float32, shape ...int64) (*param, error) {
		p := &param{module: module, reduce: strings.TrimSuffix(module, ".opt") + ".grad_allreduce", n: int(shape[0])}
		if len(shape) > 1 {
			p.n *= int(shape[1])
		}
		var err error
		if p.w, err = tensor(shape, scale); err != nil {
			return nil, err
		}
		if p.g, err = tensor(shape, 0); err != nil {
			return nil, err
		}
		if p.m, err = tensor(shape, 0); err != nil {
			return nil, err
		}
		n.params = append(n.params, p)
		return p, nil
	}
	uniform := func(fanIn int, gain float64) float32 { return float32(math.Sqrt(3 * gain / float64(fanIn))) }
	var err error
	// The teacher's first layer is scaled up so that tanh bends.
	if n.t1, err = tensor([]int64{int64(m.In), int64(m.TeacherHidden)}, uniform(m.In, 4)); err != nil {
		return nil, err
	}
	if n.tc, err = tensor([]int64{int64(m.TeacherHidden)}, 0.5); err != nil {
		return nil, err
	}
	if n.t2, err = tensor([]int64{int64(m.TeacherHidden), int64(m.Out)}, uniform(m.TeacherHidden, 2)); err != nil {
		return nil, err
	}
	if n.win, err = newParam("stem.opt", uniform(m.In, 1), int64(m.In), int64(m.Width)); err != nil {
		return nil, err
	}
	n.blocks = make([]block, m.Layers)
	for l := range n.blocks {
		b := &n.blocks[l]
		pre := fmt.Sprintf("block.%d.", l)
		if b.w1, err = newParam(pre+"fc1.weight.opt", uniform(m.Width, 2), int64(m.Width), int64(m.FFN)); err != nil {
			return nil, err
		}
		if b.b1, err = newParam(pre+"fc1.bias.opt", 0, int64(m.FFN)); err != nil {
			return nil, err
		}
		if b.w2, err = newParam(pre+"fc2.weight.opt", uniform(m.FFN, 1.0/float64(m.Layers)), int64(m.FFN), int64(m.Width)); err != nil {
			return nil, err
		}
		b.fc1, b.act, b.fc2, b.res = pre+"fc1", pre+"act", pre+"fc2", pre+"residual"
		b.bfc2, b.bfc2x, b.bact, b.bb1, b.bfc1, b.bres = pre+"fc2.grad_weight", pre+"fc2.grad_input", pre+"act.backward",
			pre+"fc1.grad_bias", pre+"fc1.grad_weight", pre+"fc1.grad_input"
	}
	if n.wout, err = newParam("head.weight.opt", uniform(m.Width, 1), int64(m.Width), int64(m.Out)); err != nil {
		return nil, err
	}
	if n.bout, err = newParam("head.bias.opt", 0, int64(m.Out)); err != nil {
		return nil, err
	}
	return n, nil
}

// act allocates an activation right before the op that produces it, as
// the Engine expects (its allocation is recorded against that op).
func (n *net) act(shape []int64) (*chameleon.Tensor, error) {
	size := int64(4)
	for _, d := range shape {
		size *= d
	}
	return n.eng.NewTensor(size, chameleon.Activation, "float32", shape)
}

// run drives one op through the Engine: Before makes its tensors resident
// (queuing waits on the compute stream), kernel queues the work, reading
// addresses with Ptr now, inside the op, because a tensor swapped out and
// back may sit at a new address; After lets the Engine start swap-outs.
//
// With recompute on, a forward op hands the Engine its kernel as Recompute:
// the kernel reads and writes through the handles it captured, so running
// it again makes the same output from the same inputs (the kernels are
// deterministic and draw no random numbers).
func (n *net) run(name, module string, phase trace.Phase, in, out []*chameleon.Tensor, kernel func() error) error {
	n.op = chameleon.Op{Name: name, Module: module, Phase: phase, In: append(n.op.In[:0], in...), Out: append(n.op.Out[:0], out...)}
	if n.recompute && phase == trace.PhaseForward {
		n.op.Recompute = kernel
	}
	if err := n.it.Before(&n.op); err != nil {
		return err
	}
	if err := kernel(); err != nil {
		return fmt.Errorf("%s (%s): %w", name, module, err)
	}
	return n.it.After(&n.op)
}

func (n *net) release(ts ...*chameleon.Tensor) error {
	var errs []error
	for _, t := range ts {
		errs = append(errs, n.eng.Release(t))
	}
	return errors.Join(errs...)
}

// ts is shorthand for an op's tensor list.
func ts(t ...*chameleon.Tensor) []*chameleon.Tensor { return t }

// saved is what a block's backward needs from its forward.
type saved struct{ h, r *chameleon.Tensor }

// step runs one training step: data, teacher, forward, loss, backward,
// SGD with momentum, and reading the loss. Blocks with skip[l] set are
// left out of the step (stochastic depth), which changes the operator
// sequence. It returns the loss computed in the forward.
func (n *net) step(index int, skip []bool, lr, mu float32) (float32, chameleon.Result, error) {
	m := n.m
	B, H, F, D, O, T := m.Batch, m.Width, m.FFN, m.In, m.Out, m.TeacherHidden
	n.it = n.eng.Begin()
	fwd, bwd, opt := trace.PhaseForward, trace.PhaseBackward, trace.PhaseOptimizer
	fail := func(err error) (float32, chameleon.Result, error) {
		return 0, chameleon.Result{}, fmt.Errorf("step %d: %w", index, err)
	}

	// Data: a fresh batch and its targets from the teacher.
	x, err := n.act(n.shBD)
	if err != nil {
		return fail(err)
	}
	if err := n.run("aten::uniform_", "data.x", fwd, nil, ts(x), func() error {
		return n.k.Uniform(x.Ptr(), B*D, shardSeed(mix(n.seed, 2, uint64(index)), uint64(n.row0)*uint64(D)), float32(math.Sqrt(3)))
	}); err != nil {
		return fail(err)
	}
	th, err := n.act(n.shBT)
	if err != nil {
		return fail(err)
	}
	if err := n.run("aten::mm", "teacher.fc1", fwd, ts(x, n.t1), ts(th), func() error {
		return n.k.Gemm(false, false, B, T, D, 1, x.Ptr(), n.t1.Ptr(), 0, th.Ptr())
	}); err != nil {
		return fail(err)
	}
	if err := n.run("aten::tanh_", "teacher.act", fwd, ts(th, n.tc), ts(th), func() error {
		return n.k.BiasAct(th.Ptr(), th.Ptr(), n.tc.Ptr(), B, T, compute.Tanh)
	}); err != nil {
		return fail(err)
	}
	var y *chameleon.Tensor
	var ys []*chameleon.Tensor // the chunks' targets, with LossChunks
	if m.chunks() > 1 {
		if ys, err = n.teacherChunks(th); err != nil {
			return fail(err)
		}
	} else {
		if y, err = n.act(n.shBO); err != nil {
			return fail(err)
		}
		if err := n.run("aten::mm", "teacher.fc2", fwd, ts(th, n.t2), ts(y), func() error {
			return n.k.Gemm(false, false, B, O, T, 1, th.Ptr(), n.t2.Ptr(), 0, y.Ptr())
		}); err != nil {
			return fail(err)
		}
	}
	if err := n.release(th); err != nil {
		return fail(err)
	}

	// Forward.
	h, err := n.act(n.shBH)
	if err != nil {
		return fail(err)
	}
	h0 := h // h moves on with the blocks; a kernel run again writes this one
	if err := n.run("aten::mm", "stem", fwd, ts(x, n.win.w), ts(h0), func() error {
		return n.k.Gemm(false, false, B, H, D, 1, x.Ptr(), n.win.w.Ptr(), 0, h0.Ptr())
	}); err != nil {
		return fail(err)
	}
	keep := make([]saved, len(n.blocks))
	for l := range n.blocks {
		if skip != nil && skip[l] {
			continue
		}
		b := &n.blocks[l]
		in := h // the block's input, fixed for a kernel run again
		a, err := n.act(n.shBF)
		if err != nil {
			return fail(err)
		}
		if err := n.run("aten::mm", b.fc1, fwd, ts(in, b.w1.w), ts(a), func() error {
			return n.k.Gemm(false, false, B, F, H, 1, in.Ptr(), b.w1.w.Ptr(), 0, a.Ptr())
		}); err != nil {
			return fail(err)
		}
		r, err := n.act(n.shBF)
		if err != nil {
			return fail(err)
		}
		if err := n.run("aten::relu", b.act, fwd, ts(a, b.b1.w), ts(r), func() error {
			return n.k.BiasAct(r.Ptr(), a.Ptr(), b.b1.w.Ptr(), B, F, compute.ReLU)
		}); err != nil {
			return fail(err)
		}
		if err := n.release(a); err != nil {
			return fail(err)
		}
		z, err := n.act(n.shBH)
		if err != nil {
			return fail(err)
		}
		if err := n.run("aten::mm", b.fc2, fwd, ts(r, b.w2.w), ts(z), func() error {
			return n.k.Gemm(false, false, B, H, F, 1, r.Ptr(), b.w2.w.Ptr(), 0, z.Ptr())
		}); err != nil {
			return fail(err)
		}
		hn, err := n.act(n.shBH)
		if err != nil {
			return fail(err)
		}
		if err := n.run("aten::add", b.res, fwd, ts(in, z), ts(hn), func() error {
			return n.k.Add(hn.Ptr(), in.Ptr(), z.Ptr(), B*H)
		}); err != nil {
			return fail(err)
		}
		if err := n.release(z); err != nil {
			return fail(err)
		}
		keep[l] = saved{h: in, r: r}
		h = hn
	}
	// The head and the loss: the batch whole, or a chunk of it at a time.
	var pred, loss *chameleon.Tensor
	var preds []*chameleon.Tensor
	if m.chunks() > 1 {
		preds, loss, err = n.headChunks(h, ys)
	} else {
		pred, loss, err = n.head(h, y)
	}
	if err != nil {
		return fail(err)
	}

	if n.phaseSync {
		if err := n.eng.Device().SyncStream(n.eng.ComputeStream()); err != nil {
			return fail(err)
		}
		n.fwdEnd = time.Now()
	}

	// Backward.
	var dh *chameleon.Tensor
	if m.chunks() > 1 {
		dh, err = n.headChunksBackward(h, preds, ys)
	} else {
		dh, err = n.headBackward(h, pred, y)
	}
	if err != nil {
		return fail(err)
	}
	if n.hoist {
		// The head's gradients are final and the backward reads its
		// weight no more.
		if err := n.stepNow(lr, mu, bwd, n.wout, n.bout); err != nil {
			return fail(err)
		}
	}
	for l := len(n.blocks) - 1; l >= 0; l-- {
		if skip != nil && skip[l] {
			continue
		}
		b, s := &n.blocks[l], keep[l]
		if err := n.run("aten::mm", b.bfc2, bwd, ts(s.r, dh), ts(b.w2.g), func() error {
			return n.k.Gemm(true, false, F, H, B, 1, s.r.Ptr(), dh.Ptr(), 0, b.w2.g.Ptr())
		}); err != nil {
			return fail(err)
		}
		dr, err := n.act(n.shBF)
		if err != nil {
			return fail(err)
		}
		if err := n.run("aten::mm", b.bfc2x, bwd, ts(dh, b.w2.w), ts(dr), func() error {
			return n.k.Gemm(false, true, B, F, H, 1, dh.Ptr(), b.w2.w.Ptr(), 0, dr.Ptr())
		}); err != nil {
			return fail(err)
		}
		// In place: dr becomes the gradient before the ReLU.
		if err := n.run("aten::threshold_backward_", b.bact, bwd, ts(dr, s.r), ts(dr), func() error {
			return n.k.ReluBackward(dr.Ptr(), dr.Ptr(), s.r.Ptr(), B*F)
		}); err != nil {
			return fail(err)
		}
		if err := n.release(s.r); err != nil {
			return fail(err)
		}
		if err := n.run("aten::sum", b.bb1, bwd, ts(dr), ts(b.b1.g), func() error {
			return n.k.ColSum(b.b1.g.Ptr(), dr.Ptr(), B, F, false)
		}); err != nil {
			return fail(err)
		}
		if err := n.run("aten::mm", b.bfc1, bwd, ts(s.h, dr), ts(b.w1.g), func() error {
			return n.k.Gemm(true, false, H, F, B, 1, s.h.Ptr(), dr.Ptr(), 0, b.w1.g.Ptr())
		}); err != nil {
			return fail(err)
		}
		// The residual: dh_in = dh + dr*W1^T, a copy then a GEMM with beta 1.
		dhn, err := n.act(n.shBH)
		if err != nil {
			return fail(err)
		}
		if err := n.run("aten::addmm", b.bres, bwd, ts(dh, dr, b.w1.w), ts(dhn), func() error {
			if err := n.eng.Device().CopyD2D(dhn.Ptr(), dh.Ptr(), dh.Size(), n.eng.ComputeStream()); err != nil {
				return err
			}
			return n.k.Gemm(false, true, B, H, F, 1, dr.Ptr(), b.w1.w.Ptr(), 1, dhn.Ptr())
		}); err != nil {
			return fail(err)
		}
		if err := n.release(dh, dr, s.h); err != nil {
			return fail(err)
		}
		dh = dhn
		if n.hoist {
			if err := n.stepNow(lr, mu, bwd, b.w1, b.b1, b.w2); err != nil {
				return fail(err)
			}
		}
	}
	if err := n.run("aten::mm", "stem.grad_weight", bwd, ts(x, dh), ts(n.win.g), func() error {
		return n.k.Gemm(true, false, D, H, B, 1, x.Ptr(), dh.Ptr(), 0, n.win.g.Ptr())
	}); err != nil {
		return fail(err)
	}
	if err := n.release(x, dh); err != nil {
		return fail(err)
	}
	if n.hoist {
		if err := n.stepNow(lr, mu, bwd, n.win); err != nil {
			return fail(err)
		}
	}

	// Data parallelism: each rank replaces its gradients, and the loss,
	// with their mean over the ranks, so that every rank applies the same
	// update, that of the global batch, and reports the same loss. One op
	// per tensor, in the same order on every rank (a skipped block's
	// parameters are skipped by all), each of them resident only while
	// its own all-reduce runs; with hoist, each gradient's right before
	// its parameter's step, in the backward.
	if n.reduce != nil {
		if err := n.run("c10d::allreduce_", "loss.allreduce", bwd, ts(loss), ts(loss), func() error {
			return n.reduce.AllReduce(loss.Ptr(), 1)
		}); err != nil {
			return fail(err)
		}
	}

	// Optimizer: a skipped block's parameters got no gradient this step
	// and keep their momentum as it was. With hoist, every parameter
	// stepped in the backward.
	if !n.hoist {
		n.live = n.live[:0]
		for i, p := range n.params {
			if !n.skipped(skip, i) {
				n.live = append(n.live, p)
			}
		}
		if err := n.stepNow(lr, mu, opt, n.live...); err != nil {
			return fail(err)
		}
	}

	// loss.item(): the step's one host synchronization, at its end, which
	// also makes the iteration time the Engine measures the device's.
	if err := n.run("aten::_local_scalar_dense", "loss.item", opt, ts(loss), nil, func() error {
		return n.eng.Device().ReadDevice(n.lossBuf[:], loss.Ptr())
	}); err != nil {
		return fail(err)
	}
	if err := n.release(loss); err != nil {
		return fail(err)
	}
	res := n.it.End()
	return math.Float32frombits(uint32(n.lossBuf[0]) | uint32(n.lossBuf[1])<<8 | uint32(n.lossBuf[2])<<16 | uint32(n.lossBuf[3])<<24), res, nil
}

// stepNow runs the optimizer step of ps, all-reduced first with ranks:
// one fused SGD step over them, run in pieces (Iteration.Pieces), a
// parameter, its gradient and its momentum at a time, so that only one
// piece need be on the device. The update of each element reads only its
// own parameter, gradient and momentum, so the step's result is the same
// bits whether ps are stepped together at the end of the step or a few at
// a time in the backward (hoist), the Engine streaming the momentum
// buffers beside the gradients.
func (n *net) stepNow(lr, mu float32, phase trace.Phase, ps ...*param) error {
	if n.reduce != nil {
		for _, p := range ps {
			if err := n.run("c10d::allreduce_", p.reduce, trace.PhaseBackward, ts(p.g), ts(p.g), func() error {
				return n.reduce.AllReduce(p.g.Ptr(), p.n)
			}); err != nil {
				return err
			}
		}
	}
	n.pieces, n.stepped = n.pieces[:0], n.stepped[:0]
	for _, p := range ps {
		n.pieces = append(n.pieces, chameleon.Piece{In: ts(p.w, p.g, p.m), Out: ts(p.w, p.m)})
		n.stepped = append(n.stepped, p)
	}
	n.op = chameleon.Op{Name: "aten::_fused_sgd_", Module: "optimizer", Phase: phase}
	return n.it.Pieces(&n.op, n.pieces, func(i int) error {
		p := n.stepped[i]
		return n.k.SGD(p.w.Ptr(), p.g.Ptr(), p.m.Ptr(), p.n, lr, mu)
	})
}

// skipped says whether parameter i belongs to a block skip leaves out.
func (n *net) skipped(skip []bool, i int) bool {
	return skip != nil && i >= 1 && i < 1+3*len(n.blocks) && skip[(i-1)/3]
}

// shardSeed is the seed under which compute.Uniform's element i is
// element first+i of the sequence under seed: Hash(seed, i) mixes
// seed + (i+1)*golden, so moving the seed by first*golden (mod 2^64)
// moves the counter. A rank whose batch starts at row r of the global
// batch draws its rows with shardSeed(seed, r*In): the very numbers the
// global batch has there, with no host upload and on every backend.
func shardSeed(seed, first uint64) uint64 { return seed + first*0x9E3779B97F4A7C15 }

// skipPatterns returns the layer-skip patterns of a dynamic run: pattern 0
// runs every block, each other one leaves out a random quarter of them
// (at least one). A quarter changes the op count by far more than the
// detector's 5%, so every switch is a sequence change; a small set of
// patterns makes them recur, which is what the policy cache is for.
func skipPatterns(layers, count int, seed uint64) [][]bool {
	rng := rand.New(rand.NewPCG(seed, 0x5e9))
	pats := [][]bool{make([]bool, layers)}
	for len(pats) < count {
		p := make([]bool, layers)
		k := max(1, layers/4)
		if k >= layers {
			k = layers - 1
		}
		if k == 0 {
			break
		}
		for _, l := range rng.Perm(layers)[:k] {
			p[l] = true
		}
		pats = append(pats, p)
	}
	return pats
}
