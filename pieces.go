package chameleon

import (
	"fmt"
	"slices"
)

// Piece is one independent piece of an op (Iteration.Pieces): the tensors
// it reads and writes beside those every piece shares.
type Piece struct {
	In, Out []*Tensor
}

// Pieces runs op as len(pieces) ops, one piece at a time: an op over lists
// of tensors whose elements do not depend on each other (a fused or
// _foreach_ optimizer step, a multi-tensor copy, the zeroing of gradients)
// or along a dimension no piece reads across (a loss over the logits,
// computed a chunk of the batch at a time, each chunk's logits a tensor of
// its own: a piece lists whole tensors, and a piece's memory is that of
// the tensors it lists). Run whole, such an op needs
// every tensor it lists resident at once, which sets a floor under any
// plan (every parameter, gradient and optimizer state in a fused step);
// in pieces, only one piece's are, and the planner plans the pieces as
// ops: the rest of the step's tensors stream around them.
//
// Piece i is an op of its own for the Engine, named as op, listing
// pieces[i].In and Out and then op.In and op.Out, the tensors every piece
// shares (a found-inf flag, a scale); run(i) launches its kernels on the
// compute stream between its Before and After, and may read the tensors'
// Ptr. op's FLOPs and Bytes are shared out by the bytes each piece lists.
// A piece has no Recompute: op.Recompute must be nil. The host must give
// the same pieces in the same order every iteration for the Engine to see
// the same op sequence.
//
// No pieces: nothing runs. The first error stops the op: from Before or
// After of a piece (wrapped with the piece), or from run, after which the
// piece's After is not called and the iteration must End.
func (it *Iteration) Pieces(op *Op, pieces []Piece, run func(i int) error) error {
	if op.Recompute != nil {
		return fmt.Errorf("chameleon: op %s in %d pieces: a piece has no Recompute", op.Name, len(pieces))
	}
	if run == nil {
		return fmt.Errorf("chameleon: op %s in %d pieces: nil run", op.Name, len(pieces))
	}
	size := func(ts ...[]*Tensor) (n float64) {
		for _, l := range ts {
			for _, t := range l {
				if t != nil {
					n += float64(t.size)
				}
			}
		}
		return n
	}
	var total float64
	for _, p := range pieces {
		total += size(p.In, p.Out)
	}
	q := *op
	for i, p := range pieces {
		share := 1 / float64(len(pieces))
		if total > 0 {
			share = size(p.In, p.Out) / total
		}
		q.In, q.Out = slices.Concat(p.In, op.In), slices.Concat(p.Out, op.Out)
		q.FLOPs, q.Bytes = op.FLOPs*share, op.Bytes*share
		if err := it.Before(&q); err != nil {
			return fmt.Errorf("piece %d of %d: %w", i, len(pieces), err)
		}
		if err := run(i); err != nil {
			return err
		}
		if err := it.After(&q); err != nil {
			return fmt.Errorf("piece %d of %d: %w", i, len(pieces), err)
		}
	}
	return nil
}
