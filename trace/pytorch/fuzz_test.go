package pytorch

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/chameleon-go/chameleon/trace"
)

type tensorID = trace.TensorID

// FuzzImport feeds both decoders. It must never panic, must reject input
// that is not JSON, and what it accepts must be a consistent iteration.
func FuzzImport(f *testing.F) {
	et, k := smallET(smallNodes, false), smallKineto(0)
	f.Add(et, k)
	f.Add(smallET(smallNodes, true), k)
	f.Add(gz(et), gz(k))
	f.Add(smallET(smallNodes[:5], false), k)
	f.Add(et, smallKineto(3))
	f.Add(et[:len(et)/2], k)
	f.Add([]byte(`{"nodes": [{"id": 1, "name": "aten::mm", "ctrl_deps": 1, "attrs": [{"name": "rf_id", "value": 1}]}]}`),
		[]byte(`{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "args": {"Record function id": 1, "External id": 3}}, {"ph": "X", "cat": "kernel", "ts": 2, "dur": 1, "args": {"External id": 3}}, {"ph": "i", "name": "[memory]", "ts": 2, "args": {"Total Allocated": 10, "Bytes": 10}}]}`))
	f.Add([]byte("garbage"), []byte("{"))
	f.Add([]byte{0x1f, 0x8b, 8, 0}, []byte{})
	f.Fuzz(func(t *testing.T, et, k []byte) {
		res, err := Load(bytes.NewReader(et), "et", bytes.NewReader(k), "k")
		if err != nil {
			return
		}
		if !isGzip(et) && !json.Valid(et) || !isGzip(k) && !json.Valid(k) {
			t.Fatalf("accepted input that is not JSON")
		}
		it := res.Trace.Iterations[0]
		if len(it.Ops) == 0 || len(res.Ops) != len(it.Ops) || res.MatchedOps == 0 {
			t.Fatalf("accepted with %d ops, %d infos, %d matched", len(it.Ops), len(res.Ops), res.MatchedOps)
		}
		hasMem := it.Ops[0].Mem >= 0
		for i, op := range it.Ops {
			if (op.Mem >= 0) != hasMem || op.DurUS < 0 {
				t.Fatalf("op %d: mem %d dur %g", i, op.Mem, op.DurUS)
			}
			for _, id := range append(append([]int64(nil), ids(op.In)...), ids(op.Out)...) {
				if tt := it.Tensors[tensorID(id)]; tt == nil || tt.Bytes < 0 {
					t.Fatalf("op %d: bad ref %d", i, id)
				}
			}
		}
	})
}

func isGzip(b []byte) bool { return len(b) >= 2 && b[0] == 0x1f && b[1] == 0x8b }

func ids[T ~int64](l []T) []int64 {
	out := make([]int64, len(l))
	for i, v := range l {
		out[i] = int64(v)
	}
	return out
}
