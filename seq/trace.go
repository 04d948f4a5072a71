package seq

import "github.com/chameleon-go/chameleon/trace"

// EncodeIteration records a recorded iteration through e and returns its
// profile. An op's allocated bytes are those of the activation storages it
// is the first to produce in the iteration, which is what a host reports
// live when an op returns fresh outputs.
func EncodeIteration(e *Encoder, it *trace.Iteration) Profile {
	seen := make(map[trace.TensorID]struct{}, len(it.Tensors))
	for i := range it.Ops {
		op := &it.Ops[i]
		for _, id := range op.In {
			seen[id] = struct{}{}
		}
		var alloc int64
		for _, id := range op.Out {
			if _, ok := seen[id]; ok {
				continue
			}
			seen[id] = struct{}{}
			if t := it.Tensors[id]; t != nil && t.Kind == trace.KindActivation {
				alloc += t.Bytes
			}
		}
		e.Record(op.Name, op.Overload, alloc)
	}
	return e.Finish()
}
