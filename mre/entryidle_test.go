package mre

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/trace"
)

// TestEntryIdle: two optimizer states live from the step before, state 1
// read at op 1 and state 2 at op 3 (the last), an activation made at op 0.
// Before op 1 state 1 may be off, copied out in the step before after its
// read there (op 1), in the 20 µs left of that step: 20 bytes at 1 byte a
// µs, all of it (1024 bytes) at 1000. State 2, read by the step's last op,
// has no time left to leave in, and the activation is this step's.
func TestEntryIdle(t *testing.T) {
	it := &trace.Iteration{
		Tensors: map[trace.TensorID]*trace.Tensor{
			1: {ID: 1, Bytes: 1024, Kind: trace.KindOptState},
			2: {ID: 2, Bytes: 2048, Kind: trace.KindOptState},
			3: {ID: 3, Bytes: 4096, Kind: trace.KindActivation},
		},
		Ops: []trace.Op{
			{Name: "aten::empty", Out: []trace.TensorID{3}, Mem: -1},
			{Name: "aten::mul_", In: []trace.TensorID{1, 3}, Mem: -1},
			{Name: "aten::add", In: []trace.TensorID{3}, Mem: -1},
			{Name: "aten::mul_", In: []trace.TensorID{2}, Mem: -1},
		},
	}
	m := memory.Build(it, nil)
	d := []float64{10, 10, 10, 10}
	assert.Equal(t, []int64{20, 0, 0, 0}, EntryIdle(m, d, 1e6))
	assert.Equal(t, []int64{1024, 0, 0, 0}, EntryIdle(m, d, 1e9))
	// A state read first thing leaves nothing idle before it.
	it.Ops[0].In = []trace.TensorID{1}
	assert.Equal(t, []int64{0, 0, 0, 0}, EntryIdle(memory.Build(it, nil), d, 1e9))
}
