package main

import (
	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/examples/train/compute"
	"github.com/chameleon-go/chameleon/trace"
)

// The head (pred = h Wout + bout) and the MSE loss against the teacher's
// target, the batch whole (head, headBackward) or a chunk of the batch at
// a time (Model.LossChunks: teacherChunks, headChunks,
// headChunksBackward). In chunks, each chunk's target, prediction and
// prediction gradient is a tensor of its own, so that no op lists the
// whole batch's predictions and the planner can swap or recompute the
// chunks apart: the chunked cross-entropy of a language model, whose
// logits are the widest tensor of its step. The loss and the head's
// gradients are summed over the chunks, in chunk order.

// rowsAt is the address of row r of t, rows of width floats: read inside
// an op's kernel, as Ptr is.
func rowsAt(t *chameleon.Tensor, r, width int) device.DevPtr {
	return t.Ptr() + device.DevPtr(4*r*width)
}

// head runs the head and the loss over the whole batch: it returns the
// prediction, kept for the backward, and the loss.
func (n *net) head(h, y *chameleon.Tensor) (pred, loss *chameleon.Tensor, err error) {
	B, H, O := n.m.Batch, n.m.Width, n.m.Out
	fwd := trace.PhaseForward
	if pred, err = n.act(n.shBO); err != nil {
		return nil, nil, err
	}
	if err := n.run("aten::mm", "head", fwd, ts(h, n.wout.w), ts(pred), func() error {
		return n.k.Gemm(false, false, B, O, H, 1, h.Ptr(), n.wout.w.Ptr(), 0, pred.Ptr())
	}); err != nil {
		return nil, nil, err
	}
	if err := n.run("aten::add_", "head.bias", fwd, ts(pred, n.bout.w), ts(pred), func() error {
		return n.k.BiasAct(pred.Ptr(), pred.Ptr(), n.bout.w.Ptr(), B, O, compute.Identity)
	}); err != nil {
		return nil, nil, err
	}
	if loss, err = n.act(n.shScalar); err != nil {
		return nil, nil, err
	}
	if err := n.run("aten::mse_loss", "loss", fwd, ts(pred, y), ts(loss), func() error {
		return n.k.MSELoss(loss.Ptr(), pred.Ptr(), y.Ptr(), B*O, B*O, false)
	}); err != nil {
		return nil, nil, err
	}
	return pred, loss, nil
}

// headBackward runs the loss's and the head's backward over the whole
// batch and returns the gradient of h; it releases pred, y and h.
func (n *net) headBackward(h, pred, y *chameleon.Tensor) (*chameleon.Tensor, error) {
	B, H, O := n.m.Batch, n.m.Width, n.m.Out
	bwd := trace.PhaseBackward
	dpred, err := n.act(n.shBO)
	if err != nil {
		return nil, err
	}
	if err := n.run("aten::mse_loss_backward", "loss.backward", bwd, ts(pred, y), ts(dpred), func() error {
		return n.k.MSEBackward(dpred.Ptr(), pred.Ptr(), y.Ptr(), B*O, B*O)
	}); err != nil {
		return nil, err
	}
	if err := n.release(pred, y); err != nil {
		return nil, err
	}
	if err := n.run("aten::mm", "head.grad_weight", bwd, ts(h, dpred), ts(n.wout.g), func() error {
		return n.k.Gemm(true, false, H, O, B, 1, h.Ptr(), dpred.Ptr(), 0, n.wout.g.Ptr())
	}); err != nil {
		return nil, err
	}
	if err := n.run("aten::sum", "head.grad_bias", bwd, ts(dpred), ts(n.bout.g), func() error {
		return n.k.ColSum(n.bout.g.Ptr(), dpred.Ptr(), B, O, false)
	}); err != nil {
		return nil, err
	}
	dh, err := n.act(n.shBH)
	if err != nil {
		return nil, err
	}
	if err := n.run("aten::mm", "head.grad_input", bwd, ts(dpred, n.wout.w), ts(dh), func() error {
		return n.k.Gemm(false, true, B, H, O, 1, dpred.Ptr(), n.wout.w.Ptr(), 0, dh.Ptr())
	}); err != nil {
		return nil, err
	}
	return dh, n.release(dpred, h)
}

// teacherChunks makes the teacher's target a chunk of the batch at a
// time, from its hidden layer th.
func (n *net) teacherChunks(th *chameleon.Tensor) ([]*chameleon.Tensor, error) {
	O, T := n.m.Out, n.m.TeacherHidden
	ys := make([]*chameleon.Tensor, n.m.chunks())
	for c := range ys {
		r0, r1 := n.m.chunkRows(c)
		y, err := n.act(n.shCO[c])
		if err != nil {
			return nil, err
		}
		if err := n.run("aten::mm", "teacher.fc2", trace.PhaseForward, ts(th, n.t2), ts(y), func() error {
			return n.k.Gemm(false, false, r1-r0, O, T, 1, rowsAt(th, r0, T), n.t2.Ptr(), 0, y.Ptr())
		}); err != nil {
			return nil, err
		}
		ys[c] = y
	}
	return ys, nil
}

// headChunks runs the head and the loss a chunk of the batch at a time:
// it returns each chunk's prediction, kept for the backward, and the
// loss, the chunks' sums added in chunk order over the whole batch's
// count.
func (n *net) headChunks(h *chameleon.Tensor, ys []*chameleon.Tensor) ([]*chameleon.Tensor, *chameleon.Tensor, error) {
	B, H, O := n.m.Batch, n.m.Width, n.m.Out
	fwd := trace.PhaseForward
	preds := make([]*chameleon.Tensor, len(ys))
	var loss *chameleon.Tensor
	for c, y := range ys {
		r0, r1 := n.m.chunkRows(c)
		rows := r1 - r0
		pred, err := n.act(n.shCO[c])
		if err != nil {
			return nil, nil, err
		}
		if err := n.run("aten::mm", "head", fwd, ts(h, n.wout.w), ts(pred), func() error {
			return n.k.Gemm(false, false, rows, O, H, 1, rowsAt(h, r0, H), n.wout.w.Ptr(), 0, pred.Ptr())
		}); err != nil {
			return nil, nil, err
		}
		if err := n.run("aten::add_", "head.bias", fwd, ts(pred, n.bout.w), ts(pred), func() error {
			return n.k.BiasAct(pred.Ptr(), pred.Ptr(), n.bout.w.Ptr(), rows, O, compute.Identity)
		}); err != nil {
			return nil, nil, err
		}
		in := ts(pred, y)
		if c == 0 {
			if loss, err = n.act(n.shScalar); err != nil {
				return nil, nil, err
			}
		} else {
			in = append(in, loss) // added to
		}
		if err := n.run("aten::mse_loss", "loss", fwd, in, ts(loss), func() error {
			return n.k.MSELoss(loss.Ptr(), pred.Ptr(), y.Ptr(), rows*O, B*O, c > 0)
		}); err != nil {
			return nil, nil, err
		}
		preds[c] = pred
	}
	return preds, loss, nil
}

// headChunksBackward runs the loss's and the head's backward a chunk at a
// time, the head's gradients summed over the chunks in chunk order, and
// returns the gradient of h, each chunk's rows written by its chunk; it
// releases the predictions, the targets and h.
func (n *net) headChunksBackward(h *chameleon.Tensor, preds, ys []*chameleon.Tensor) (*chameleon.Tensor, error) {
	B, H, O := n.m.Batch, n.m.Width, n.m.Out
	bwd := trace.PhaseBackward
	var dh *chameleon.Tensor
	for c, pred := range preds {
		y := ys[c]
		r0, r1 := n.m.chunkRows(c)
		rows := r1 - r0
		first := c == 0
		dpred, err := n.act(n.shCO[c])
		if err != nil {
			return nil, err
		}
		if err := n.run("aten::mse_loss_backward", "loss.backward", bwd, ts(pred, y), ts(dpred), func() error {
			return n.k.MSEBackward(dpred.Ptr(), pred.Ptr(), y.Ptr(), rows*O, B*O)
		}); err != nil {
			return nil, err
		}
		if err := n.release(pred, y); err != nil {
			return nil, err
		}
		// Summed over the chunks: from the second on, the op reads the
		// gradient it adds to.
		var beta float32
		wg, bg := ts(h, dpred), ts(dpred)
		if !first {
			beta = 1
			wg, bg = append(wg, n.wout.g), append(bg, n.bout.g)
		}
		if err := n.run("aten::mm", "head.grad_weight", bwd, wg, ts(n.wout.g), func() error {
			return n.k.Gemm(true, false, H, O, rows, 1, rowsAt(h, r0, H), dpred.Ptr(), beta, n.wout.g.Ptr())
		}); err != nil {
			return nil, err
		}
		if err := n.run("aten::sum", "head.grad_bias", bwd, bg, ts(n.bout.g), func() error {
			return n.k.ColSum(n.bout.g.Ptr(), dpred.Ptr(), rows, O, !first)
		}); err != nil {
			return nil, err
		}
		in := ts(dpred, n.wout.w)
		if first {
			if dh, err = n.act(n.shBH); err != nil {
				return nil, err
			}
		} else {
			in = append(in, dh) // the rows the chunks before wrote
		}
		if err := n.run("aten::mm", "head.grad_input", bwd, in, ts(dh), func() error {
			return n.k.Gemm(false, true, rows, H, O, 1, dpred.Ptr(), n.wout.w.Ptr(), 0, rowsAt(dh, r0, H))
		}); err != nil {
			return nil, err
		}
		if err := n.release(dpred); err != nil {
			return nil, err
		}
	}
	return dh, n.release(h)
}
