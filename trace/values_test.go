package trace_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

// Values that parse but make nonsense: iteration indices that repeat, go
// back or are negative, times that are negative or absurd, costs of 1e300.
// Each is refused with a ParseError naming the file, the line and the
// field; the values at the caps are accepted.

const valHeader = `{"type":"header","format":"optrace/v1","model":"m"}`

// valTensor declares tensor 0 of 16 bytes.
const valTensor = `{"type":"tensor","id":0,"bytes":16,"dtype":"float32","shape":[4],"kind":"act"}`

// valOp is op 0 of iteration iter writing tensor 0, with extra fields.
func valOp(iter int, extra string) string {
	return fmt.Sprintf(`{"type":"op","iter":%d,"seq":0,"name":"aten::mm","phase":"fwd","out":[0]%s}`, iter, extra)
}

// valEnd ends iteration iter of one op, with extra fields.
func valEnd(iter int, extra string) string {
	return fmt.Sprintf(`{"type":"iter_end","iter":%d,"ops":1%s}`, iter, extra)
}

// valTrace is a trace of the given iterations (one op each) and footer.
func valTrace(iters []int, opExtra, endExtra, footer string) string {
	lines := []string{valHeader, valTensor}
	for _, i := range iters {
		lines = append(lines, valOp(i, opExtra), valEnd(i, endExtra))
	}
	return strings.Join(append(lines, footer), "\n") + "\n"
}

const valFooter = `{"type":"footer"}`

func requireParseError(t *testing.T, err error, line int, field string, want ...string) {
	t.Helper()
	require.Error(t, err)
	var pe *trace.ParseError
	require.True(t, errors.As(err, &pe), "got %T: %v", err, err)
	assert.Equal(t, "bad.jsonl", pe.File)
	assert.Equal(t, line, pe.Line, "%v", err)
	assert.Equal(t, field, pe.Field, "%v", err)
	for _, w := range want {
		assert.Contains(t, err.Error(), w)
	}
}

func TestIterationIndicesIncrease(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		line  int
		field string
		want  []string
	}{
		// Lines: 1 header, 2 tensor, then an op and an iter_end per
		// iteration.
		{"duplicate", valTrace([]int{0, 0}, "", "", valFooter), 5, "iter", []string{"bad.jsonl:5:", "iteration 0 again (it started at line 3)"}},
		{"out of order", valTrace([]int{3, 1}, "", "", valFooter), 5, "iter", []string{"iteration 1 after iteration 3 (line 3)"}},
		{"negative", valTrace([]int{-2}, "", "", valFooter), 3, "iter", []string{"negative iteration index -2"}},
		{"negative after others", valTrace([]int{0, 1, -1}, "", "", valFooter), 7, "iter", []string{"negative"}},
		{"duplicate empty iteration", valHeader + "\n" + `{"type":"iter_end","iter":4,"ops":0}` + "\n" + `{"type":"iter_end","iter":4,"ops":0}` + "\n" + valFooter + "\n",
			3, "iter", []string{"iteration 4 again (it started at line 2)"}},
		{"empty iteration goes back", valHeader + "\n" + valTensor + "\n" + valOp(7, "") + "\n" + valEnd(7, "") + "\n" + `{"type":"iter_end","iter":2,"ops":0}` + "\n" + valFooter + "\n",
			5, "iter", []string{"iteration 2 after iteration 7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := trace.Read(strings.NewReader(tt.in), "bad.jsonl")
			requireParseError(t, err, tt.line, tt.field, tt.want...)
		})
	}
	// Increasing, with gaps (a recorder may leave iterations out): read.
	tr, err := trace.Read(strings.NewReader(valTrace([]int{0, 2, 5}, "", "", valFooter)), "ok.jsonl")
	require.NoError(t, err)
	require.Len(t, tr.Iterations, 3)
	assert.Equal(t, 5, tr.Iterations[2].Index)
}

func TestTimesAndCostsInRange(t *testing.T) {
	tests := []struct {
		name            string
		op, end, footer string
		line            int
		field           string
		want            string
	}{
		{name: "wall_ms negative", end: `,"wall_ms":-7.3e306`, line: 4, field: "wall_ms", want: "negative: -7.3e+306 ms"},
		{name: "wall_ms over a day", end: `,"wall_ms":86400000.5`, line: 4, field: "wall_ms", want: "more than a day"},
		{name: "wall_ms huge", end: `,"wall_ms":1e308`, line: 4, field: "wall_ms", want: "more than a day"},
		{name: "uninstrumented_ms negative", end: `,"uninstrumented_ms":-0.001`, line: 4, field: "uninstrumented_ms", want: "negative"},
		{name: "uninstrumented_ms huge", end: `,"uninstrumented_ms":1e300`, line: 4, field: "uninstrumented_ms", want: "more than a day"},
		{name: "footer negative", footer: `{"type":"footer","uninstrumented_iter_ms":[1.5,-2]}`, line: 5, field: "uninstrumented_iter_ms", want: "element 1: negative"},
		{name: "footer huge", footer: `{"type":"footer","uninstrumented_iter_ms":[1e300]}`, line: 5, field: "uninstrumented_iter_ms", want: "element 0: 1e+300 ms, more than a day"},
		{name: "dur_us huge", op: `,"dur_us":1e308`, line: 3, field: "dur_us", want: "1e+308 µs, more than an hour (3.6e+09 µs)"},
		{name: "dur_us over an hour", op: `,"dur_us":3600000001`, line: 3, field: "dur_us", want: "more than an hour"},
		{name: "dur_us negative", op: `,"dur_us":-1`, line: 3, field: "dur_us", want: "negative"},
		{name: "flops huge", op: `,"flops":1e300`, line: 3, field: "flops", want: "1e+300, more than the FLOPs an op may declare (1e+21)"},
		{name: "flops negative", op: `,"flops":-1e300`, line: 3, field: "flops", want: "negative: -1e+300"},
		{name: "io_bytes huge", op: `,"io_bytes":1e300`, line: 3, field: "io_bytes", want: "more than the bytes an op may declare (1e+18 bytes)"},
		{name: "io_bytes negative", op: `,"io_bytes":-5`, line: 3, field: "io_bytes", want: "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			footer := valFooter
			if tt.footer != "" {
				footer = tt.footer
			}
			_, err := trace.Read(strings.NewReader(valTrace([]int{0}, tt.op, tt.end, footer)), "bad.jsonl")
			requireParseError(t, err, tt.line, tt.field, tt.want)
		})
	}
	// At the caps: read, kept as they are.
	in := valTrace([]int{0},
		fmt.Sprintf(`,"dur_us":%d,"flops":%g,"io_bytes":%g`, int64(trace.MaxOpUS), float64(trace.MaxOpFLOPs), float64(trace.MaxOpIOBytes)),
		fmt.Sprintf(`,"wall_ms":%d,"uninstrumented_ms":%d`, trace.MaxIterMS, trace.MaxIterMS),
		fmt.Sprintf(`{"type":"footer","uninstrumented_iter_ms":[0,%d]}`, trace.MaxIterMS))
	tr, err := trace.Read(strings.NewReader(in), "caps.jsonl")
	require.NoError(t, err)
	it := tr.Iterations[0]
	assert.Equal(t, float64(trace.MaxIterMS), it.WallMS)
	assert.Equal(t, float64(trace.MaxIterMS), it.TimeMS)
	assert.Equal(t, float64(trace.MaxOpUS), it.Ops[0].DurUS)
	assert.Equal(t, float64(trace.MaxOpFLOPs), it.Ops[0].FLOPs)
	assert.Equal(t, float64(trace.MaxOpIOBytes), it.Ops[0].IOBytes)
}

// kernelsDoc is a kernels document of n ops with the given fields.
func kernelsDoc(n int, iterMS, totalMS, opUS string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"format":"optrace-kernels/v1","model":"m","seq_len":8,"iteration_ms":%s,"kernel_ms_total":%s,"ops":[`, iterMS, totalMS)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		us := "12.5"
		if i == n-1 {
			us = opUS
		}
		fmt.Fprintf(&b, `{"seq":%d,"name":"aten::mm","overload":"default","kernel_us":%s}`, i, us)
	}
	b.WriteString("]}")
	return b.String()
}

func TestReadKernelsRefusesBadTimes(t *testing.T) {
	tests := []struct {
		name, iter, total, op string
		field, want           string
	}{
		{"iteration_ms negative", "-7.3e306", "1", "1", "iteration_ms", "negative"},
		{"iteration_ms huge", "1e308", "1", "1", "iteration_ms", "more than a day"},
		{"kernel_ms_total negative", "1", "-1", "1", "kernel_ms_total", "negative"},
		{"kernel_ms_total over a day", "1", "86400001", "1", "kernel_ms_total", "more than a day"},
		{"kernel_us huge", "1", "1", "1e308", "ops[2].kernel_us", "1e+308 µs, more than an hour"},
		{"kernel_us negative", "1", "1", "-3", "ops[2].kernel_us", "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := trace.ReadKernels(strings.NewReader(kernelsDoc(3, tt.iter, tt.total, tt.op)), "bad.kernels.json")
			var pe *trace.ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, "bad.kernels.json", pe.File)
			assert.Equal(t, 1, pe.Line)
			assert.Equal(t, tt.field, pe.Field)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	k, err := trace.ReadKernels(strings.NewReader(kernelsDoc(3, fmt.Sprint(trace.MaxIterMS), fmt.Sprint(trace.MaxIterMS), fmt.Sprint(int64(trace.MaxOpUS)))), "caps.kernels.json")
	require.NoError(t, err)
	assert.Equal(t, float64(trace.MaxIterMS), k.IterationMS)
	assert.Equal(t, float64(trace.MaxOpUS), k.Ops[2].KernelUS)
}

// A kernels file cut anywhere, gzip or plain, is an error naming it: a
// cut-off file must never read as fewer ops.
func TestReadKernelsTruncated(t *testing.T) {
	doc := []byte(kernelsDoc(200, "115.7", "112.3", "9.5") + "\n")
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, err := zw.Write(doc)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	gz := zb.Bytes()
	_, err = trace.ReadKernels(bytes.NewReader(gz), "k.kernels.json.gz")
	require.NoError(t, err)
	// Every byte of the end (the last deflate block, the checksum and the
	// length), every fifth before.
	for cut := 2; cut < len(gz); cut++ {
		if cut < len(gz)-24 && cut%5 != 0 {
			continue
		}
		_, err := trace.ReadKernels(bytes.NewReader(gz[:cut]), "k.kernels.json.gz")
		require.Error(t, err, "gzip cut at %d of %d", cut, len(gz))
		require.Contains(t, err.Error(), "k.kernels.json.gz")
	}
	for cut := 1; cut < len(doc)-1; cut += 61 {
		_, err := trace.ReadKernels(bytes.NewReader(doc[:cut]), "k.kernels.json")
		require.Error(t, err, "cut at %d of %d", cut, len(doc))
	}
}
