package pytorch

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

// cycleET is seedET's mm (node 1, a root) with the extra nodes.
func cycleET(extra ...string) []byte {
	op := strings.TrimSuffix(strings.TrimPrefix(seedET, `{"nodes":[`), `]}`)
	return []byte(`{"nodes":[` + strings.Join(append([]string{op}, extra...), ",") + `]}`)
}

// linkNode is a node named x<id> whose parent (under key) is parent.
func linkNode(id, parent int, key string) string {
	return fmt.Sprintf(`{"id":%d,"name":"x%d","%s":%d}`, id, id, key, parent)
}

// Parent links that come back on themselves are refused, naming every node
// of the cycle in link order and the field the links came from; a node
// that is its own parent is a root (the process node of every real trace
// is).
func TestParentCycles(t *testing.T) {
	long := make([]string, 40)
	for i := range long {
		long[i] = linkNode(100+i, 100+(i+1)%len(long), "ctrl_deps")
	}
	tests := []struct {
		name  string
		et    []byte
		where string
		field string
		want  string
	}{
		{"two", cycleET(linkNode(5, 6, "ctrl_deps"), linkNode(6, 5, "ctrl_deps")), "node 5", "ctrl_deps", "a cycle of 2 nodes: 5 -> 6 -> 5;"},
		{"three, entered from a chain", cycleET(linkNode(4, 7, "ctrl_deps"), linkNode(5, 6, "ctrl_deps"), linkNode(6, 7, "ctrl_deps"), linkNode(7, 5, "ctrl_deps")),
			"node 5", "ctrl_deps", "a cycle of 3 nodes: 5 -> 6 -> 7 -> 5;"},
		{"flat layout", cycleET(linkNode(8, 9, "parent"), linkNode(9, 8, "parent")), "node 8", "parent", "a cycle of 2 nodes: 8 -> 9 -> 8;"},
		{"through the op", []byte(strings.Replace(string(cycleET(linkNode(5, 1, "ctrl_deps"))), `"ctrl_deps":1,`, `"ctrl_deps":5,`, 1)),
			"node 1", "ctrl_deps", "a cycle of 2 nodes: 1 -> 5 -> 1;"},
		{"negative ids", cycleET(linkNode(-3, -2, "ctrl_deps"), linkNode(-2, -3, "ctrl_deps")), "node -3", "ctrl_deps", "a cycle of 2 nodes: -3 -> -2 -> -3;"},
		{"long", cycleET(long...), "node 100", "ctrl_deps", "a cycle of 40 nodes: 100 -> 101 -> 102 -> 103 -> 104 -> 105 -> 106 -> 107 -> 108 -> 109 -> 110 -> 111 -> 112 -> 113 -> 114 -> 115 -> ... -> 100;"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(bytes.NewReader(tt.et), "c.et.json", strings.NewReader(seedKineto), "c.kineto.json")
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "got %v", err)
			assert.Equal(t, "c.et.json", pe.File)
			assert.Equal(t, tt.where, pe.Where)
			assert.Equal(t, tt.field, pe.Field)
			assert.Contains(t, err.Error(), "parent links form "+tt.want)
		})
	}
	// Roots: its own parent, a parent not in the trace, no parent.
	for _, et := range [][]byte{cycleET(linkNode(5, 5, "ctrl_deps")), cycleET(linkNode(5, 77, "parent")), cycleET(`{"id":5,"name":"x"}`)} {
		_, err := Load(bytes.NewReader(et), "c.et.json", strings.NewReader(seedKineto), "c.kineto.json")
		require.NoError(t, err, "%s", et)
	}
}

// Kineto times that are negative or absurd are refused naming the event
// and the field; an op whose time is over an hour and a step that spans
// more than a day are refused naming the node or the file.
func TestKinetoTimesInRange(t *testing.T) {
	const cpuOp = `{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":%s,"dur":%s,"args":{"Record function id":1,"External id":3}}`
	const kernel = `{"ph":"X","cat":"kernel","name":"k","ts":%s,"dur":%s,"args":{"External id":3}}`
	kineto := func(events ...string) string { return `{"traceEvents":[` + strings.Join(events, ",") + `]}` }
	tests := []struct {
		name, k, where, field, want string
	}{
		{"kernel dur 1e299", kineto(fmt.Sprintf(cpuOp, "1", "2"), fmt.Sprintf(kernel, "2", "1e299")), "traceEvents[1]", "dur", "1e+299 µs, more than a day (8.64e+10 µs)"},
		{"cpu_op dur over a day", kineto(fmt.Sprintf(cpuOp, "1", "86400000001")), "traceEvents[0]", "dur", "more than a day"},
		{"dur negative", kineto(fmt.Sprintf(cpuOp, "1", "-0.5")), "traceEvents[0]", "dur", "negative: -0.5 µs"},
		{"ts 1e299", kineto(fmt.Sprintf(cpuOp, "1e299", "2")), "traceEvents[0]", "ts", "more than 2^53 µs"},
		{"ts far below zero", kineto(fmt.Sprintf(cpuOp, "-1e17", "2")), "traceEvents[0]", "ts", "more than 2^53 µs"},
		{"memory ts 1e299", kineto(fmt.Sprintf(cpuOp, "1", "2"), `{"ph":"i","name":"[memory]","ts":1e299,"args":{"Total Allocated":16}}`), "traceEvents[1]", "ts", "2^53"},
		{"an op's kernels over an hour", kineto(fmt.Sprintf(cpuOp, "1", "2"), fmt.Sprintf(kernel, "2", "2000000000"), fmt.Sprintf(kernel, "3", "2000000000")),
			"node 1 (aten::mm)", "dur", "the kernels, copies and memsets it launched take 4e+09 µs, more than an hour (3.6e+09 µs)"},
		{"an op's host time over an hour", kineto(fmt.Sprintf(cpuOp, "1", "3600000001")), "node 1 (aten::mm)", "dur", "its cpu_op takes 3.600000001e+09 µs, more than an hour"},
		{"a step over a day", kineto(fmt.Sprintf(cpuOp, "1", "2"), fmt.Sprintf(kernel, "1e11", "1")), "", "ts", "the profiled step spans 1e+08 ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(strings.NewReader(seedET), "t.et.json", strings.NewReader(tt.k), "t.kineto.json")
			var pe *ParseError
			require.True(t, errors.As(err, &pe), "got %v", err)
			assert.Equal(t, "t.kineto.json", pe.File)
			assert.Equal(t, tt.where, pe.Where)
			assert.Equal(t, tt.field, pe.Field)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	// At the caps: a kernel of an hour in a step of a day, at ts 2^53
	// less a day.
	ts := fmt.Sprint(int64(MaxTimestampUS - MaxEventUS))
	k := kineto(fmt.Sprintf(cpuOp, ts, "2"), fmt.Sprintf(kernel, ts, fmt.Sprint(int64(trace.MaxOpUS))),
		`{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","ts":`+ts+`,"dur":`+fmt.Sprint(int64(MaxEventUS))+`}`)
	res, err := Load(strings.NewReader(seedET), "t.et.json", strings.NewReader(k), "t.kineto.json")
	require.NoError(t, err)
	it := res.Trace.Iterations[0]
	assert.Equal(t, float64(trace.MaxOpUS), it.Ops[0].DurUS)
	assert.Equal(t, float64(trace.MaxIterMS), it.WallMS)
}
