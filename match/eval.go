package match

import (
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// Produced is one tensor an op of an iteration produced: where (op and
// output slot) and its features.
type Produced struct {
	Op, Slot int
	Tensor   trace.TensorID
	Features Features
}

// ProducedTensors lists, in order, the activation storages each op of it
// produces (first appearance as an output), with their features. Tokens
// come from v, so the producers of two iterations compare.
func ProducedTensors(it *trace.Iteration, v *seq.Vocab) []Produced {
	seen := make(map[trace.TensorID]struct{}, len(it.Tensors))
	var out []Produced
	for i := range it.Ops {
		op := &it.Ops[i]
		for _, id := range op.In {
			seen[id] = struct{}{}
		}
		tok := uint32(v.Token(op.Name, op.Overload))
		stack := Hash(op.Module)
		for s, id := range op.Out {
			if _, ok := seen[id]; ok {
				continue
			}
			seen[id] = struct{}{}
			t := it.Tensors[id]
			if t == nil || t.Kind != trace.KindActivation {
				continue
			}
			out = append(out, Produced{Op: i, Slot: s, Tensor: id, Features: Features{
				Ptr: t.Ptr, Stack: stack, Producer: tok, Shape: ShapeHash(t.Shape),
			}})
		}
	}
	return out
}

// Quality is how well matching did against the ground truth.
type Quality struct {
	Planned   int // planned tensors with a counterpart in the later iteration
	Matched   int // live tensors matched to some planned one
	Correct   int // matched to the planned tensor at the same op position and output slot
	Precision float64
	Recall    float64
}

// Evaluate matches every produced tensor of later against those of planned
// and scores the result. The ground truth is position: the tensor produced
// at the same op index and output slot by an op of the same name. It is
// only meaningful where the two sequences align (a static or same-shape
// dynamic iteration); positions whose ops differ have no counterpart.
func Evaluate(cfg Config, planned, later *trace.Iteration) Quality {
	v := seq.NewVocab()
	p := ProducedTensors(planned, v)
	l := ProducedTensors(later, v)
	feats := make([]Features, len(p))
	type pos struct{ op, slot int }
	at := make(map[pos]int, len(p))
	for i, x := range p {
		feats[i] = x.Features
		at[pos{x.Op, x.Slot}] = i
	}
	m := New(cfg, feats)
	var q Quality
	for _, x := range l {
		truth, ok := at[pos{x.Op, x.Slot}]
		if ok && (x.Op >= len(planned.Ops) || planned.Ops[x.Op].Name != later.Ops[x.Op].Name) {
			ok = false
		}
		if ok {
			q.Planned++
		}
		got, _ := m.Match(x.Features)
		if got < 0 {
			continue
		}
		q.Matched++
		if ok && got == truth {
			q.Correct++
		}
	}
	if q.Matched > 0 {
		q.Precision = float64(q.Correct) / float64(q.Matched)
	}
	if q.Planned > 0 {
		q.Recall = float64(q.Correct) / float64(q.Planned)
	}
	return q
}
