package trace_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/trace"
)

const small = "../testdata/llama4-small.jsonl.gz"

// sharedTrace is the path of a public trace; the test skips without it.
func sharedTrace(t testing.TB, name string) string { return testtraces.Path(t, name) }

func TestReadSmall(t *testing.T) {
	tr, err := trace.ReadFile(small)
	require.NoError(t, err)
	assert.Equal(t, "llama-small", tr.Header.Model)
	assert.Equal(t, "bf16", tr.Header.AMP)
	require.Len(t, tr.Iterations, 3)
	for k, it := range tr.Iterations {
		assert.Equal(t, k, it.Index)
		assert.Len(t, it.Ops, 994)
		assert.True(t, it.HasMem())
		assert.Positive(t, it.TimeMS)
		assert.Equal(t, int64(1323298304), it.PeakBytes)
		for i, op := range it.Ops {
			require.Equal(t, i, op.Seq)
			for _, id := range append(append([]trace.TensorID{}, op.In...), op.Out...) {
				require.NotNil(t, it.Tensor(id), "op %d references tensor %d", i, id)
			}
		}
	}
	op0 := tr.Iterations[0].Ops[0]
	assert.Equal(t, "aten::embedding", op0.Name)
	assert.Equal(t, trace.PhaseForward, op0.Phase)
	assert.Equal(t, []trace.TensorID{0, 1}, op0.In)
	assert.Equal(t, trace.KindParam, tr.Iterations[0].Tensor(0).Kind)
	assert.Equal(t, 2, tr.Iterations[0].Tensor(0).Line, "declared on the line after the header")
	assert.Equal(t, 5, op0.Line)
	// Parameters are declared once and shared by every iteration.
	assert.Same(t, tr.Iterations[0].Tensor(0), tr.Iterations[2].Tensor(0))
}

func TestReadAllShared(t *testing.T) {
	tests := []struct {
		give  string
		iters int
		ops   []int
	}{
		{give: "llama16-bf16.jsonl.gz", iters: 6, ops: []int{3706}},
		{give: "llama16-bf16-ckpt.jsonl.gz", iters: 4, ops: []int{5687}},
		{give: "llama16-fp16-scaler.jsonl.gz", iters: 10, ops: []int{4174, 4174, 4174, 6087, 4174, 5646}},
		{give: "mixtral8-eager-bf16.jsonl.gz", iters: 6, ops: []int{5594}},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			tr, err := trace.ReadFile(sharedTrace(t, tt.give))
			require.NoError(t, err)
			require.Len(t, tr.Iterations, tt.iters)
			for k, n := range tt.ops {
				assert.Len(t, tr.Iterations[k].Ops, n, "iteration %d", k)
			}
		})
	}
}

// plain returns the small trace decompressed.
func plain(t testing.TB) []byte {
	t.Helper()
	f, err := os.Open(small)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	b, err := io.ReadAll(zr)
	require.NoError(t, err)
	return b
}

func TestPlainEqualsGzip(t *testing.T) {
	a, err := trace.Read(bytes.NewReader(plain(t)), "plain")
	require.NoError(t, err)
	b, err := trace.ReadFile(small)
	require.NoError(t, err)
	require.Len(t, a.Iterations, len(b.Iterations))
	for k := range a.Iterations {
		assert.Equal(t, b.Iterations[k].Ops, a.Iterations[k].Ops)
	}
}

func TestTruncatedGzipIsAnError(t *testing.T) {
	raw, err := os.ReadFile(small)
	require.NoError(t, err)
	for _, cut := range []int{len(raw) / 3, len(raw) / 2, len(raw) - 9} {
		_, err := trace.Read(bytes.NewReader(raw[:cut]), "cut.jsonl.gz")
		require.Error(t, err, "cut at %d", cut)
		assert.Contains(t, err.Error(), "cut.jsonl.gz")
	}
}

func TestTruncatedPlainIsAnError(t *testing.T) {
	b := plain(t)
	// Cut at a line boundary: every line parses, but the footer is missing.
	cut := bytes.LastIndex(b[:len(b)/2], []byte("\n")) + 1
	_, err := trace.Read(bytes.NewReader(b[:cut]), "cut.jsonl")
	require.Error(t, err)
	assert.ErrorIs(t, err, trace.ErrTruncated)
}

func TestBadInputNamesFileLineField(t *testing.T) {
	hdr := `{"type":"header","format":"optrace/v1","model":"m"}`
	t0 := `{"type":"tensor","id":0,"bytes":16,"dtype":"float32","shape":[4],"kind":"act","ptr":1}`
	tests := []struct {
		name  string
		lines []string
		field string
		line  int
	}{
		{"format", []string{`{"type":"header","format":"optrace/v9"}`}, "format", 1},
		{"first line", []string{t0}, "type", 1},
		{"bytes type", []string{hdr, `{"type":"tensor","id":0,"bytes":"x","kind":"act"}`}, "bytes", 2},
		{"kind", []string{hdr, `{"type":"tensor","id":0,"bytes":1,"kind":"weird"}`}, "kind", 2},
		{"dup id", []string{hdr, t0, t0}, "id", 3},
		{"undeclared", []string{hdr, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","in":[7],"out":[]}`}, "in", 2},
		{"seq", []string{hdr, t0, `{"type":"op","iter":0,"seq":1,"name":"aten::mm","phase":"fwd","in":[0],"out":[]}`}, "seq", 3},
		{"phase", []string{hdr, t0, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"sideways","in":[0]}`}, "phase", 3},
		{"ops count", []string{hdr, t0, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","in":[0]}`, `{"type":"iter_end","iter":0,"ops":2}`}, "ops", 4},
		{"syntax", []string{hdr, `{"type":"op",`}, "", 2},
		{"bytes negative", []string{hdr, `{"type":"tensor","id":0,"bytes":-1,"kind":"act"}`}, "bytes", 2},
		{"bytes above the cap", []string{hdr, `{"type":"tensor","id":0,"bytes":9223372036854775807,"kind":"act"}`}, "bytes", 2},
		{"bytes beyond int64", []string{hdr, `{"type":"tensor","id":0,"bytes":1e19,"kind":"act"}`}, "bytes", 2},
		{"shape not a list", []string{hdr, `{"type":"tensor","id":0,"bytes":1,"shape":4,"kind":"act"}`}, "shape", 2},
		{"shape fraction", []string{hdr, `{"type":"tensor","id":0,"bytes":1,"shape":[4.5],"kind":"act"}`}, "shape", 2},
		{"shape negative", []string{hdr, `{"type":"tensor","id":0,"bytes":1,"shape":[4,-1],"kind":"act"}`}, "shape", 2},
		{"shape dims", []string{hdr, `{"type":"tensor","id":0,"bytes":1,"shape":[` + list("1", trace.MaxShapeDims+1) + `],"kind":"act"}`}, "shape", 2},
		{"mem negative", []string{hdr, t0, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","out":[0],"mem":-1}`}, "mem", 3},
		{"mem above the cap", []string{hdr, t0, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","out":[0],"mem":1000000000000000000}`}, "mem", 3},
		{"peak negative", []string{hdr, t0, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","out":[0]}`, `{"type":"iter_end","iter":0,"ops":1,"peak_bytes":-5}`}, "peak_bytes", 4},
		{"in count", []string{hdr, t0, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","in":[` + list("0", trace.MaxOpTensors+1) + `]}`}, "in", 3},
		{"out count", []string{hdr, t0, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","out":[` + list("0", trace.MaxOpTensors+1) + `]}`}, "out", 3},
		{"frozen activation", []string{hdr, `{"type":"tensor","id":0,"bytes":1,"kind":"act","frozen":true}`}, "frozen", 2},
		{"frozen not a bool", []string{hdr, `{"type":"tensor","id":0,"bytes":1,"kind":"param","frozen":1}`}, "frozen", 2},
		{"in type", []string{hdr, t0, `{"type":"op","iter":0,"seq":0,"name":"aten::mm","phase":"fwd","in":["0"]}`}, "in", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := strings.Join(tt.lines, "\n") + "\n"
			_, err := trace.Read(strings.NewReader(in), "bad.jsonl")
			require.Error(t, err)
			var pe *trace.ParseError
			require.True(t, errors.As(err, &pe), "got %T: %v", err, err)
			assert.Equal(t, "bad.jsonl", pe.File)
			assert.Equal(t, tt.line, pe.Line)
			assert.Equal(t, tt.field, pe.Field)
		})
	}
}

// list is n copies of v, comma-separated.
func list(v string, n int) string { return strings.Repeat(v+",", n-1) + v }

func TestListsAtTheirCaps(t *testing.T) {
	in := `{"type":"header","format":"optrace/v1"}
{"type":"tensor","id":0,"bytes":16,"shape":[` + list("1", trace.MaxShapeDims) + `],"kind":"act"}
{"type":"op","iter":0,"seq":0,"name":"aten::cat","phase":"fwd","in":[` + list("0", 1000) + `],"out":[0],"mem":4398046511104}
{"type":"iter_end","iter":0,"ops":1,"peak_bytes":4398046511104}
{"type":"footer"}
`
	tr, err := trace.Read(strings.NewReader(in), "caps.jsonl")
	require.NoError(t, err)
	it := tr.Iterations[0]
	assert.Len(t, it.Tensor(0).Shape, trace.MaxShapeDims)
	assert.Len(t, it.Ops[0].In, 1000)
	assert.Equal(t, int64(trace.MaxBytes), it.Ops[0].Mem)
	assert.Equal(t, int64(trace.MaxBytes), it.PeakBytes)
}

// spaces is an endless line of blanks; n counts the bytes read from it.
type spaces struct{ n int64 }

func (s *spaces) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	s.n += int64(len(p))
	return len(p), nil
}

// A line over MaxLineBytes fails once the cap is passed, without reading
// (or holding) the rest of it.
func TestLongLineFailsAtTheCap(t *testing.T) {
	src := &spaces{}
	hdr := strings.NewReader(`{"type":"header","format":"optrace/v1"}` + "\n")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := trace.Read(io.MultiReader(hdr, src), "long.jsonl")
	runtime.ReadMemStats(&after)
	var pe *trace.ParseError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 2, pe.Line)
	assert.Contains(t, err.Error(), "long.jsonl:2: line longer than")
	assert.Less(t, src.n, int64(trace.MaxLineBytes+1<<17), "read past the cap")
	// What one capped line may cost: the line buffer and its growth.
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(3*trace.MaxLineBytes))
}

// The same through gzip: a small file that inflates to an endless line.
func TestLongGzipLineFailsAtTheCap(t *testing.T) {
	pr, pw := io.Pipe()
	written := make(chan int64, 1)
	go func() {
		zw := gzip.NewWriter(pw)
		_, err := io.WriteString(zw, `{"type":"header","format":"optrace/v1"}`+"\n")
		chunk := bytes.Repeat([]byte{' '}, 1<<16)
		var n int64
		for err == nil && n < 1<<30 {
			_, err = zw.Write(chunk)
			n += int64(len(chunk))
		}
		written <- n
		pw.CloseWithError(io.ErrUnexpectedEOF)
	}()
	_, err := trace.Read(pr, "long.jsonl.gz")
	pr.CloseWithError(io.ErrClosedPipe) // stops the writer
	var pe *trace.ParseError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 2, pe.Line)
	assert.Contains(t, err.Error(), "line longer than")
	// The writer is at most a deflate block ahead of the reader.
	assert.Less(t, <-written, int64(2*trace.MaxLineBytes), "inflated past the cap")
}

func TestReadKernels(t *testing.T) {
	k, err := trace.ReadKernelsFile(sharedTrace(t, "llama16-bf16.kernels.json.gz"))
	require.NoError(t, err)
	assert.Len(t, k.Ops, 3706)
	assert.InDelta(t, 115.7, k.IterationMS, 0.1)
	var sum float64
	for _, op := range k.Ops {
		sum += op.KernelUS
	}
	assert.InDelta(t, k.KernelMSTotal, sum/1000, 0.5)
}

// FuzzRead feeds arbitrary bytes to the reader: it must return an error or
// a well-formed trace, never panic, and every op must reference declared
// tensors. The seeds are small on purpose: the fuzzer minimizes every input
// that finds new coverage, and minimizing kilobytes of real trace lines
// stalls it for most of a run.
func FuzzRead(f *testing.F) {
	const hdr = `{"type":"header","format":"optrace/v1","model":"m","amp":"bf16","seq":8}` + "\n"
	one := hdr +
		`{"type":"tensor","id":0,"bytes":64,"dtype":"bfloat16","shape":[4,8],"kind":"param","ptr":4096}` + "\n" +
		`{"type":"tensor","id":1,"bytes":16,"dtype":"int64","shape":[2],"kind":"input"}` + "\n" +
		`{"type":"tensor","id":2,"bytes":96,"dtype":"bfloat16","shape":[2,24],"kind":"act"}` + "\n" +
		`{"type":"op","iter":0,"seq":0,"name":"aten::embedding","overload":"default","phase":"fwd","module":"model.embed","in":[0,1],"out":[2],"dur_us":12.5,"mem":96}` + "\n"
	f.Add([]byte(hdr + `{"type":"footer"}` + "\n"))
	f.Add([]byte(one +
		`{"type":"iter_end","iter":0,"ops":1,"peak_bytes":96}` + "\n" + `{"type":"footer","uninstrumented_iter_ms":[1.5]}` + "\n"))
	f.Add([]byte(hdr +
		`{"type":"tensor","id":0,"bytes":16,"kind":"act"}` + "\n" +
		`{"type":"op","iter":0,"seq":0,"name":"a","phase":"fwd","in":[],"out":[0],"mem":16}` + "\n" +
		`{"type":"op","iter":0,"seq":1,"name":"b","phase":"bwd","in":[0,0],"out":[0],"mem":16}` + "\n" +
		`{"type":"iter_end","iter":0,"ops":2,"peak_bytes":32}` + "\n" + `{"type":"footer"}` + "\n"))
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = io.WriteString(zw, hdr+`{"type":"footer"}`+"\n")
	_ = zw.Close()
	f.Add(zb.Bytes())
	// Small forms (small for the minimizer's sake) of the hostile inputs
	// of limits_test.go: ops with long in and out lists, long distinct
	// module names, a long footer list, iterations without ops, blank
	// lines in a gzip.
	zeros := strings.Repeat("0,", 15) + "0"
	f.Add([]byte(hdr + `{"type":"tensor","id":0,"bytes":16,"kind":"act"}` + "\n" +
		`{"type":"op","iter":0,"seq":0,"name":"aten::cat","phase":"fwd","in":[` + zeros + `],"out":[` + zeros + `]}` + "\n" +
		`{"type":"op","iter":0,"seq":1,"name":"aten::cat","phase":"fwd","in":[` + zeros + `]}` + "\n" +
		`{"type":"iter_end","iter":0,"ops":2}` + "\n" + `{"type":"footer"}` + "\n"))
	long := strings.Repeat("x", 64)
	f.Add([]byte(hdr + `{"type":"tensor","id":0,"bytes":16,"kind":"act"}` + "\n" +
		`{"type":"op","iter":0,"seq":0,"name":"a","phase":"fwd","module":"0` + long + `","in":[0]}` + "\n" +
		`{"type":"op","iter":0,"seq":1,"name":"a","phase":"fwd","module":"1` + long + `","in":[0]}` + "\n" +
		`{"type":"iter_end","iter":0,"ops":2}` + "\n" + `{"type":"footer"}` + "\n"))
	f.Add([]byte(hdr + `{"type":"iter_end","iter":0,"ops":0}` + "\n" + `{"type":"iter_end","iter":1,"ops":0}` + "\n" +
		`{"type":"footer","uninstrumented_iter_ms":[` + zeros + `]}` + "\n"))
	zb.Reset()
	zw = gzip.NewWriter(&zb)
	_, _ = io.WriteString(zw, hdr+strings.Repeat(strings.Repeat(" ", 64)+"\n", 8)+`{"type":"footer"}`+"\n")
	_ = zw.Close()
	f.Add(zb.Bytes())
	// Values that make nonsense, each refused: iteration indices that
	// repeat, go back or are negative; times negative or over their caps;
	// declared costs of 1e300.
	t0 := `{"type":"tensor","id":0,"bytes":16,"kind":"act"}` + "\n"
	opOf := func(iter int, extra string) string {
		return fmt.Sprintf(`{"type":"op","iter":%d,"seq":0,"name":"a","phase":"fwd","out":[0]%s}`, iter, extra) + "\n"
	}
	endOf := func(iter int, extra string) string {
		return fmt.Sprintf(`{"type":"iter_end","iter":%d,"ops":1%s}`, iter, extra) + "\n"
	}
	foot := `{"type":"footer"}` + "\n"
	f.Add([]byte(hdr + t0 + opOf(0, "") + endOf(0, "") + opOf(0, "") + endOf(0, "") + foot))
	f.Add([]byte(hdr + t0 + opOf(3, "") + endOf(3, "") + opOf(1, "") + endOf(1, "") + foot))
	f.Add([]byte(hdr + t0 + opOf(-2, "") + endOf(-2, "") + foot))
	f.Add([]byte(hdr + t0 + opOf(0, "") + endOf(0, `,"wall_ms":-7.3e306,"uninstrumented_ms":1e300`) + foot))
	f.Add([]byte(hdr + t0 + opOf(0, `,"dur_us":1e308,"flops":-1e300,"io_bytes":1e300`) + endOf(0, "") + foot))
	f.Add([]byte(hdr + t0 + opOf(0, `,"flops":1e300`) + endOf(0, "") + `{"type":"footer","uninstrumented_iter_ms":[-1,1e300]}` + "\n"))
	// An optimizer step made of pieces, for Split: two parameters, their
	// gradients and two states each.
	pieces := hdr
	for id, b := range []int{64, 32, 64, 32, 64, 32, 64, 32} {
		kind := [...]string{"param", "act", "opt", "opt"}[id/2]
		pieces += fmt.Sprintf(`{"type":"tensor","id":%d,"bytes":%d,"kind":"%s"}`, id, b, kind) + "\n"
	}
	pieces += `{"type":"op","iter":0,"seq":0,"name":"aten::_foreach_add_","phase":"opt","in":[2,3,4,5],"mem":384}` + "\n" +
		`{"type":"op","iter":0,"seq":1,"name":"aten::_fused_adamw_","phase":"opt","in":[0,1,2,3,4,5,6,7],"mem":384}` + "\n" +
		`{"type":"iter_end","iter":0,"ops":2}` + "\n" + `{"type":"footer"}` + "\n"
	f.Add([]byte(pieces))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := trace.Read(bytes.NewReader(data), "fuzz")
		if err != nil {
			var pe *trace.ParseError
			if !errors.As(err, &pe) || pe.File != "fuzz" {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		last := -1
		for _, it := range tr.Iterations {
			if it.PeakBytes < 0 || it.PeakBytes > trace.MaxBytes {
				t.Fatalf("peak %d", it.PeakBytes)
			}
			if it.Index <= last {
				t.Fatalf("iteration %d after %d", it.Index, last)
			}
			last = it.Index
			if !(it.WallMS >= 0 && it.WallMS <= trace.MaxIterMS && it.TimeMS >= 0 && it.TimeMS <= trace.MaxIterMS) {
				t.Fatalf("iteration %d: wall %g ms, time %g ms", it.Index, it.WallMS, it.TimeMS)
			}
			for i, op := range it.Ops {
				if op.Seq != i {
					t.Fatalf("op %d has seq %d", i, op.Seq)
				}
				if !(op.DurUS >= 0 && op.DurUS <= trace.MaxOpUS && op.FLOPs >= 0 && op.FLOPs <= trace.MaxOpFLOPs && op.IOBytes >= 0 && op.IOBytes <= trace.MaxOpIOBytes) {
					t.Fatalf("op %d: %g µs, %g FLOPs, %g bytes", i, op.DurUS, op.FLOPs, op.IOBytes)
				}
				if op.Line < 2 || op.Mem > trace.MaxBytes || len(op.In) > trace.MaxOpTensors || len(op.Out) > trace.MaxOpTensors {
					t.Fatalf("op %d: line %d, mem %d, %d in, %d out", i, op.Line, op.Mem, len(op.In), len(op.Out))
				}
				for _, id := range append(append([]trace.TensorID(nil), op.In...), op.Out...) {
					tt := it.Tensor(id)
					if tt == nil {
						t.Fatalf("undeclared tensor %d", id)
					}
					if tt.Bytes < 0 || tt.Bytes > trace.MaxBytes || len(tt.Shape) > trace.MaxShapeDims || tt.Line < 2 || tt.Line >= op.Line {
						t.Fatalf("tensor %d: %d bytes, %d dims, line %d (op at line %d)", id, tt.Bytes, len(tt.Shape), tt.Line, op.Line)
					}
				}
			}
		}
		// What a file makes of Split: each op's pieces in order, their
		// shares adding up to one, the curve within the recording's.
		split, origins := trace.SplitTrace(tr)
		for k, it := range split.Iterations {
			orig := tr.Iterations[k]
			if len(origins[k]) != len(it.Ops) {
				t.Fatalf("iteration %d: %d origins for %d ops", k, len(origins[k]), len(it.Ops))
			}
			share := make([]float64, len(orig.Ops))
			for j, o := range origins[k] {
				if it.Ops[j].Seq != j || o.Op < 0 || o.Op >= len(orig.Ops) || (j > 0 && o.Op < origins[k][j-1].Op) {
					t.Fatalf("iteration %d: op %d (seq %d) from op %d", k, j, it.Ops[j].Seq, o.Op)
				}
				if it.Ops[j].Mem > max(orig.Ops[o.Op].Mem, 0) && orig.HasMem() {
					t.Fatalf("iteration %d: op %d: curve %d over the recording's %d", k, j, it.Ops[j].Mem, orig.Ops[o.Op].Mem)
				}
				share[o.Op] += o.Share
			}
			for i, sh := range share {
				if math.Abs(sh-1) > 1e-6 {
					t.Fatalf("iteration %d: op %d split into shares adding to %g", k, i, sh)
				}
			}
		}
	})
}

// FuzzReadKernels: the kernel-times reader returns an error or ops in seq
// order with times within their caps, never panics.
func FuzzReadKernels(f *testing.F) {
	f.Add([]byte(`{"format":"optrace-kernels/v1","iteration_ms":1,"ops":[{"seq":0,"name":"aten::mm","overload":"default","kernel_us":3.5}]}`))
	f.Add([]byte(`{"format":"optrace-kernels/v1","ops":[{"seq":1}]}`))
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	// Small forms (small for the minimizer's sake) of the hostile inputs
	// of limits_test.go: blanks and newlines between the ops (plain and
	// gzip), a long string, keys the reader skips or matches whatever
	// their case, null ops.
	blanks := `{"format":"optrace-kernels/v1","ops":[{"seq":0,"kernel_us":1},` + strings.Repeat(" \t\r\n", 8) + `{"seq":1}]}`
	f.Add([]byte(blanks))
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = io.WriteString(zw, blanks)
	_ = zw.Close()
	f.Add(zb.Bytes())
	f.Add([]byte(`{"format":"optrace-kernels/v1","note":"` + strings.Repeat("a", 64) + `","ops":[{"seq":0,"name":"` + strings.Repeat("b", 64) + `"}]}`))
	f.Add([]byte(`{"FORMAT":"optrace-kernels/v1","x":{"a":[1,{"b":"]"}]},"Ops":null,"seq_len":8}`))
	// Times negative or over their caps, and a gzip cut short.
	f.Add([]byte(`{"format":"optrace-kernels/v1","iteration_ms":-7.3e306,"kernel_ms_total":1e300,"ops":[{"seq":0,"kernel_us":1}]}`))
	f.Add([]byte(`{"format":"optrace-kernels/v1","iteration_ms":1,"ops":[{"seq":0,"kernel_us":1e308},{"seq":1,"kernel_us":-1}]}`))
	zb.Reset()
	zw = gzip.NewWriter(&zb)
	_, _ = io.WriteString(zw, `{"format":"optrace-kernels/v1","iteration_ms":1,"ops":[{"seq":0,"kernel_us":1}]}`)
	_ = zw.Close()
	f.Add(zb.Bytes()[:zb.Len()-4])
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := trace.ReadKernels(bytes.NewReader(data), "fuzz")
		if err != nil {
			var pe *trace.ParseError
			if !errors.As(err, &pe) || pe.File != "fuzz" {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if len(k.Ops) > trace.MaxKernelOps {
			t.Fatalf("%d ops", len(k.Ops))
		}
		if !(k.IterationMS >= 0 && k.IterationMS <= trace.MaxIterMS && k.KernelMSTotal >= 0 && k.KernelMSTotal <= trace.MaxIterMS) {
			t.Fatalf("iteration %g ms, kernels %g ms", k.IterationMS, k.KernelMSTotal)
		}
		for i, op := range k.Ops {
			if op.Seq != i || !(op.KernelUS >= 0 && op.KernelUS <= trace.MaxOpUS) {
				t.Fatalf("op %d: seq %d, %g us", i, op.Seq, op.KernelUS)
			}
		}
	})
}

// The LoRA trace freezes the base weights and trains the adapters; the
// decode trace freezes every parameter.
func TestFrozenParamsOfThePublicTraces(t *testing.T) {
	count := func(tr *trace.Trace) (frozen, params int) {
		seen := map[trace.TensorID]bool{}
		for _, it := range tr.Iterations {
			for id, ts := range it.Tensors {
				if seen[id] || ts.Kind != trace.KindParam {
					continue
				}
				seen[id] = true
				params++
				if ts.Frozen {
					frozen++
				}
			}
		}
		return frozen, params
	}
	lora := testtraces.Read(t, "llama16-lora.jsonl.gz")
	f, p := count(lora)
	assert.Positive(t, f, "frozen base weights")
	assert.Less(t, f, p, "the adapters are trained")
	dec := testtraces.Read(t, "llama7b-8l-decode.jsonl.gz")
	f, p = count(dec)
	assert.Positive(t, p)
	assert.Equal(t, p, f, "inference freezes every parameter")
}
