package pytorch

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/chameleon-go/chameleon/trace"
)

type tensorID = trace.TensorID

// Seeds of FuzzImport, hand-written and small. The fuzzer minimizes every
// input that finds new coverage for up to -fuzzminimizetime (60 s), and its
// minimizer tries a number of candidates quadratic in the input's length:
// seeded with the kilobytes of the small test step, a one-minute run spent
// nearly all its time minimizing.
const (
	// One mm reading and writing a tensor, attrs layout.
	seedET = `{"nodes":[{"id":1,"name":"aten::mm","ctrl_deps":1,` +
		`"inputs":{"values":[[1,2,0,4,4,"cuda:0"]],"shapes":[[2,2]],"types":["Tensor(float)"],"strides":[[2,1]]},` +
		`"outputs":{"values":[[3,4,0,4,4,"cuda:0"]],"types":["Tensor(float)"]},"attrs":[{"name":"rf_id","value":1}]}]}`
	// The same in the flat 1.0.1 layout, reading a list of tensors.
	seedFlatET = `{"schema":"1.0.1","nodes":[{"id":1,"name":"aten::mm","parent":1,"rf_id":1,` +
		`"inputs":[[[1,2,0,4,4,"cuda:0"]]],"input_types":["GenericList[Tensor(float)]"]}]}`
	// Its cpu_op, a kernel and a device memory event.
	seedKineto = `{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1,"dur":2,"args":{"Record function id":1,"External id":3}},` +
		`{"ph":"X","cat":"kernel","ts":2,"dur":1,"args":{"External id":3}},` +
		`{"ph":"i","name":"[memory]","ts":2,"args":{"Total Allocated":16,"Bytes":16,"Device Type":1}}]}`
)

// FuzzImport feeds both decoders. It must never panic, must reject input
// that is not JSON, and what it accepts must be a consistent iteration.
func FuzzImport(f *testing.F) {
	f.Add([]byte(seedET), []byte(seedKineto))
	f.Add([]byte(seedFlatET), []byte(seedKineto))
	f.Add(gz([]byte(seedET)), gz([]byte(seedKineto)))
	f.Add([]byte("garbage"), []byte("{"))
	f.Add([]byte{0x1f, 0x8b, 8, 0}, []byte{})
	// Small forms (small for the minimizer's sake) of the hostile inputs
	// of limits_test.go: a long string in a node, an event and a skipped
	// key, long lists (attrs, a tensor list, tensor parts, a shape), many
	// devices, blanks.
	long := strings.Repeat("a", 64)
	f.Add([]byte(`{"nodes":[{"id":1,"name":"`+long+`"}]}`), []byte(seedKineto))
	f.Add([]byte(seedET), []byte(`{"traceEvents":[{"ph":"X","cat":"cpu_op","ts":1,"dur":1,"name":"`+long+`"}]}`))
	f.Add([]byte(`{"pid":"`+long+`","nodes":[]}`), []byte(seedKineto))
	f.Add([]byte(`{"nodes":[{"id":1,"name":"aten::mm","attrs":[{}`+strings.Repeat(",{}", 16)+`]}]}`), []byte(seedKineto))
	f.Add([]byte(`{"nodes":[{"id":1,"name":"aten::mm","rf_id":1,"inputs":{"values":[[[1,2,0,4,4,"cuda:0"]`+strings.Repeat(`,[1,2,0,4,4,"cuda:0"]`, 4)+`]],`+
		`"shapes":[[[2,2]]],"types":["GenericList[Tensor(float)]"]},"outputs":{"values":[[3,4,0,4,4,"cuda:0",0,0]],"types":["Tensor(float)"]}}]}`), []byte(seedKineto))
	f.Add([]byte(`{"nodes":[{"id":1,"name":"aten::mm","rf_id":1,"inputs":{"values":[[1,2,0,4,4,"cuda:0"]],"types":["Tensor(float)"],`+
		`"shapes":[[`+strings.Repeat("1,", 8)+`1]],"strides":[[`+strings.Repeat("1,", 8)+`1]]}}]}`), []byte(seedKineto))
	f.Add([]byte(seedET), []byte(`{"deviceProperties":[{"name":"H200"}`+strings.Repeat(`,{}`, 16)+`],"traceEvents":[]}`))
	f.Add(gz([]byte(`{"nodes":[`+strings.Repeat(" \n", 16)+`]}`)), gz([]byte(seedKineto+strings.Repeat("\n", 16))))
	// Parent links in a cycle; Kineto times negative or absurd, an op over
	// an hour, a step over a day.
	f.Add([]byte(`{"nodes":[{"id":1,"name":"aten::mm","ctrl_deps":2,"attrs":[{"name":"rf_id","value":1}]},{"id":2,"name":"x","ctrl_deps":1}]}`), []byte(seedKineto))
	f.Add([]byte(`{"schema":"1.0.1","nodes":[{"id":1,"name":"aten::mm","parent":3,"rf_id":1},{"id":2,"name":"x","parent":1},{"id":3,"name":"y","parent":2}]}`), []byte(seedKineto))
	f.Add([]byte(seedET), []byte(strings.Replace(seedKineto, `"ts":2,"dur":1,`, `"ts":2,"dur":1e299,`, 1)))
	f.Add([]byte(seedET), []byte(strings.Replace(seedKineto, `"ts":1,"dur":2,`, `"ts":1e299,"dur":-2,`, 1)))
	f.Add([]byte(seedET), []byte(strings.Replace(seedKineto, `"ts":2,"dur":1,`, `"ts":2,"dur":4e9,`, 1)))
	f.Add([]byte(seedET), []byte(strings.Replace(seedKineto, `"ts":2,"dur":1,`, `"ts":1e11,"dur":1,`, 1)))
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
		if !(it.TimeMS >= 0 && it.TimeMS <= trace.MaxIterMS && it.WallMS >= 0 && it.WallMS <= trace.MaxIterMS) {
			t.Fatalf("accepted a step of %g ms (wall %g ms)", it.TimeMS, it.WallMS)
		}
		hasMem := it.Ops[0].Mem >= 0
		for i, op := range it.Ops {
			if (op.Mem >= 0) != hasMem || !(op.DurUS >= 0 && op.DurUS <= trace.MaxOpUS) {
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
