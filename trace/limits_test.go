package trace_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

// gen is a file made as it is read, so that a test can feed a reader
// gigabytes without holding them: line(i) gives the segments of line i
// (shared, not copied), nil after the last. read counts the bytes handed
// out.
type gen struct {
	line func(i int) [][]byte
	i    int
	cur  [][]byte
	read int64
}

func (g *gen) Read(p []byte) (int, error) {
	for len(g.cur) > 0 && len(g.cur[0]) == 0 {
		g.cur = g.cur[1:]
	}
	if len(g.cur) == 0 {
		if g.cur = g.line(g.i); g.cur == nil {
			return 0, io.EOF
		}
		g.i++
		return g.Read(p)
	}
	n := copy(p, g.cur[0])
	g.cur[0] = g.cur[0][n:]
	g.read += int64(n)
	return n, nil
}

// lines makes a gen of head, then n lines of body(i), then tail.
func lines(head string, n int, body func(i int) [][]byte, tail string) *gen {
	return &gen{line: func(i int) [][]byte {
		switch {
		case i == 0:
			return [][]byte{[]byte(head)}
		case i <= n:
			return body(i - 1)
		case i == n+1 && tail != "":
			return [][]byte{[]byte(tail)}
		}
		return nil
	}}
}

// gzipped compresses src on the fly; stop ends the writer early and
// returns the bytes it had compressed.
func gzipped(src io.Reader) (r io.Reader, stop func() int64) {
	pr, pw := io.Pipe()
	done := make(chan int64, 1)
	go func() {
		zw := gzip.NewWriter(pw)
		n, err := io.Copy(zw, src)
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
		done <- n
	}()
	return pr, func() int64 {
		pr.CloseWithError(io.ErrClosedPipe)
		return <-done
	}
}

// peakHeap runs f and returns how far the heap grew above where it stood
// before, sampled every millisecond while f ran (garbage not yet collected
// included: what the process holds), and how long f took.
func peakHeap(f func()) (uint64, time.Duration) {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	stop, done := make(chan struct{}), make(chan uint64)
	go func() {
		var peak uint64
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
			select {
			case <-stop:
				done <- peak
				return
			case <-tick.C:
			}
		}
	}()
	start := time.Now()
	f()
	took := time.Since(start)
	close(stop)
	peak := <-done
	if peak < base {
		return 0, took
	}
	return peak - base, took
}

const (
	capHeader = `{"type":"header","format":"optrace/v1","model":"m"}` + "\n"
	capT0     = `{"type":"tensor","id":0,"bytes":16,"dtype":"float32","shape":[4],"kind":"act"}` + "\n"
)

// zeros is "0,0,...,0": a list of n tensor ids.
func zeros(n int) []byte { return []byte(strings.Repeat("0,", n-1) + "0") }

func opLine(i int, rest ...[]byte) [][]byte {
	return append([][]byte{fmt.Appendf(nil, `{"type":"op","iter":0,"seq":%d,"phase":"fwd",`, i)}, rest...)
}

// Hostile files that inflate to gigabytes of valid lines: each is refused
// at the per-file cap it passes, naming the line and the field, after
// reading little more than the cap's worth and allocating under 64 MiB.
// Without the caps the first (200 lines of a million inputs, a 425 KB
// gzip) took 10 GB and 40 s, and 100 ops with distinct 15 MiB module names
// 2.1 GB.
func TestFileCapsRefuseEarly(t *testing.T) {
	mib := []byte(strings.Repeat("x", 1<<20))
	// The lines' lists, made once: the test's own garbage counts in the
	// heap it measures.
	full, many := zeros(trace.MaxOpTensors), zeros(1<<16)
	dims := []byte(`,"shape":[` + string(bytes.Repeat([]byte("1,"), trace.MaxShapeDims-1)) + `1],"kind":"act"}` + "\n")
	tests := []struct {
		name  string
		src   *gen
		line  int
		field string
		want  string
	}{
		{
			name: "refs in lines at MaxOpTensors",
			src: lines(capHeader+capT0, 200, func(i int) [][]byte {
				return opLine(i, []byte(`"name":"aten::cat","in":[`), full, []byte("]}\n"))
			}, ""),
			line: 2 + trace.MaxFileRefs/trace.MaxOpTensors + 1, field: "in", want: "tensor references in the file",
		},
		{
			name: "refs in many lines",
			src: lines(capHeader+capT0, 1<<20, func(i int) [][]byte {
				return opLine(i, []byte(`"name":"aten::cat","out":[`), many, []byte("]}\n"))
			}, ""),
			line: 2 + trace.MaxFileRefs>>16 + 1, field: "out", want: "tensor references in the file",
		},
		{
			name: "module bytes",
			src: lines(capHeader+capT0, 100, func(i int) [][]byte {
				return opLine(i, fmt.Appendf(nil, `"name":"aten::mm","in":[0],"module":"%d`, i%10), mib, []byte("\"}\n"))
			}, ""),
			line: 2 + trace.MaxFileStringBytes>>20, field: "module", want: "bytes of distinct strings",
		},
		{
			name: "distinct names",
			src: lines(capHeader+capT0, 1<<20, func(i int) [][]byte {
				return opLine(i, fmt.Appendf(nil, `"name":"op%d","in":[0]}`+"\n", i))
			}, ""),
			// The tensor's dtype and the empty overload are two strings.
			line: 2 + trace.MaxFileStrings - 1, field: "name", want: "distinct strings",
		},
		{
			name: "shape dims",
			src: lines(capHeader, 1<<20, func(i int) [][]byte {
				return [][]byte{fmt.Appendf(nil, `{"type":"tensor","id":%d,"bytes":1`, i), dims}
			}, ""),
			line: 1 + trace.MaxFileDims/trace.MaxShapeDims + 1, field: "shape", want: "shape dims in the file",
		},
		{
			name: "iterations",
			src: lines(capHeader, 1<<20, func(i int) [][]byte {
				return [][]byte{fmt.Appendf(nil, `{"type":"iter_end","iter":%d,"ops":0}`+"\n", i)}
			}, ""),
			line: 1 + trace.MaxFileIterations + 1, field: "iter", want: "iterations in the file",
		},
		{
			name: "footer times",
			src: lines(capHeader, 1, func(int) [][]byte {
				return [][]byte{[]byte(`{"type":"footer","uninstrumented_iter_ms":[`), full, []byte("]}\n")}
			}, ""),
			line: 2, field: "uninstrumented_iter_ms", want: "more than the 65536 allowed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			peak, took := peakHeap(func() { _, err = trace.Read(tt.src, "big.jsonl") })
			var pe *trace.ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, "big.jsonl", pe.File)
			assert.Equal(t, tt.line, pe.Line, "%v", err)
			assert.Equal(t, tt.field, pe.Field)
			assert.Contains(t, err.Error(), tt.want)
			assert.Less(t, len(err.Error()), 200)
			// Nothing read past the line that passed the cap but what
			// the buffer holds ahead.
			assert.Less(t, tt.src.read, int64(tt.src.i+1)*int64(trace.MaxOpTensors*2+100)+1<<16)
			assert.Less(t, peak, uint64(64<<20), "heap grew %d MiB", peak>>20)
			t.Logf("refused after %d lines, %d MiB read: heap grew %d MiB, %v", tt.src.i, tt.src.read>>20, peak>>20, took)
		})
	}
}

// The gzip of the first hostile file: refused at the same line, the writer
// stopped a deflate block past what was read.
func TestFileCapsRefuseGzipEarly(t *testing.T) {
	full := zeros(trace.MaxOpTensors)
	src := lines(capHeader+capT0, 200, func(i int) [][]byte {
		return opLine(i, []byte(`"name":"aten::cat","in":[`), full, []byte("]}\n"))
	}, "")
	zr, stop := gzipped(src)
	_, err := trace.Read(zr, "big.jsonl.gz")
	written := stop()
	var pe *trace.ParseError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 2+trace.MaxFileRefs/trace.MaxOpTensors+1, pe.Line)
	assert.Equal(t, "in", pe.Field)
	assert.Less(t, written, int64(8*(2*trace.MaxOpTensors+100)), "inflated past the cap")
}

// A file that goes on past MaxFileBytes (blank lines, which cost no line
// each) is refused there.
func TestFileBytesCap(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("reads a gigabyte")
	}
	blank := bytes.Repeat([]byte{' '}, 8<<20)
	blank[len(blank)-1] = '\n'
	src := lines(capHeader, 1<<20, func(int) [][]byte { return [][]byte{blank} }, "")
	peak, took := peakHeap(func() {
		_, err := trace.Read(src, "blank.jsonl")
		var pe *trace.ParseError
		require.ErrorAs(t, err, &pe)
		assert.Contains(t, err.Error(), "file longer than 1073741824 bytes")
		// The header and the blank lines before pass the cap.
		assert.Equal(t, 1+trace.MaxFileBytes/len(blank), pe.Line)
	})
	assert.LessOrEqual(t, src.read, int64(trace.MaxFileBytes)+int64(len(blank)))
	assert.Less(t, peak, uint64(64<<20))
	t.Logf("heap grew %d MiB, %v", peak>>20, took)
}

// Each per-file cap admits a file at the cap.
func TestFileAtTheCaps(t *testing.T) {
	full := zeros(trace.MaxOpTensors)
	src := lines(capHeader+capT0, trace.MaxFileRefs/trace.MaxOpTensors, func(i int) [][]byte {
		return opLine(i, []byte(`"name":"aten::cat","in":[`), full, []byte("]}\n"))
	}, `{"type":"iter_end","iter":0,"ops":4}`+"\n"+`{"type":"footer","uninstrumented_iter_ms":[`+string(zeros(trace.MaxFileIterations))+"]}\n")
	tr, err := trace.Read(src, "caps.jsonl")
	require.NoError(t, err)
	require.Len(t, tr.Iterations, 1)
	n := 0
	for _, op := range tr.Iterations[0].Ops {
		n += len(op.In)
	}
	assert.Equal(t, trace.MaxFileRefs, n)
}

// A kernels file that inflates to a gigabyte of blanks (a 1 MB gzip) is
// refused once MaxKernelsBytes of it are read; blanks other than newlines
// cost nothing on the way, and newlines (kept for the line numbers) or one
// huge string no more than a few times the cap. It took 2.7 GB and 9.5 s
// when the reader read the whole file into memory.
func TestKernelsBlanksFailAtTheCap(t *testing.T) {
	head := `{"format":"optrace-kernels/v1","ops":[{"seq":0,"kernel_us":1}`
	for _, tt := range []struct{ head, chunk, field string }{
		{head, " ", "ops"},
		{head, "\n", "ops"},
		{head, " \t\r\n", "ops"},
		{head + `,{"seq":1,"name":"`, "a", "ops[1]"},
		{`{"note":"`, "a", "note"},
	} {
		t.Run(fmt.Sprintf("%s %q", tt.field, tt.chunk), func(t *testing.T) {
			chunk := []byte(strings.Repeat(tt.chunk, (1<<20)/len(tt.chunk)))
			src := lines(tt.head, 1<<10, func(int) [][]byte { return [][]byte{chunk} }, "]}")
			var err error
			peak, took := peakHeap(func() { _, err = trace.ReadKernels(src, "k.json") })
			var pe *trace.ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, "k.json", pe.File)
			assert.Equal(t, tt.field, pe.Field)
			assert.Contains(t, err.Error(), "longer than 8388608 bytes")
			assert.LessOrEqual(t, src.read, int64(trace.MaxKernelsBytes)+1<<20)
			assert.Less(t, peak, uint64(64<<20), "heap grew %d MiB", peak>>20)
			t.Logf("heap grew %d MiB, %v", peak>>20, took)
		})
	}
	// Gzip: the writer stops a deflate block past the cap.
	chunk := bytes.Repeat([]byte{' '}, 1<<20)
	zr, stop := gzipped(lines(head, 1<<10, func(int) [][]byte { return [][]byte{chunk} }, "]}"))
	_, err := trace.ReadKernels(zr, "k.json.gz")
	written := stop()
	var pe *trace.ParseError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, err.Error(), "k.json.gz:1: field \"ops\": document longer than")
	assert.Less(t, written, int64(2*trace.MaxKernelsBytes))
}

func TestKernelsOpsCap(t *testing.T) {
	src := lines(`{"format":"optrace-kernels/v1","ops":[{"seq":0}`, 1<<20, func(i int) [][]byte {
		return [][]byte{fmt.Appendf(nil, `,{"seq":%d}`, i+1)}
	}, "]}")
	var err error
	peak, _ := peakHeap(func() { _, err = trace.ReadKernels(src, "k.json") })
	var pe *trace.ParseError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "ops", pe.Field)
	assert.Contains(t, err.Error(), "more than 262144 ops")
	assert.Less(t, peak, uint64(64<<20), "heap grew %d MiB", peak>>20)
}

// Errors of the kernels reader name the line the decoder stood on and the
// field.
func TestKernelsErrorsNameLineAndField(t *testing.T) {
	tests := []struct {
		name, give string
		line       int
		field      string
	}{
		{"seq", "{\"format\": \"optrace-kernels/v1\",\n\"ops\": [\n{\"seq\": 0},\n{\"seq\": 5}\n]}", 4, "ops[1].seq"},
		{"negative", "{\"format\": \"optrace-kernels/v1\",\n\n\n\"ops\": [{\"seq\": 0, \"kernel_us\": -1}]}", 4, "ops[0].kernel_us"},
		{"type", "{\"format\": \"optrace-kernels/v1\", \"ops\": [\n\n{\"seq\": \"x\"}]}", 3, "ops[0].seq"},
		{"format", "\n{\"format\": \"optrace-kernels/v9\", \"ops\": []}", 2, "format"},
		{"no format", `{"ops": []}`, 1, "format"},
		{"syntax", "{\"format\": \"optrace-kernels/v1\",\n\"ops\": [}", 2, "ops"},
		{"truncated", "{\"format\": \"optrace-kernels/v1\",\n\"ops\": [", 2, "ops"},
		{"trailing", "{\"format\": \"optrace-kernels/v1\"}\n{}", 2, ""},
		{"not an object", `[]`, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := trace.ReadKernels(strings.NewReader(tt.give), "k.json")
			var pe *trace.ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, "k.json", pe.File)
			assert.Equal(t, tt.line, pe.Line, "%v", err)
			assert.Equal(t, tt.field, pe.Field, "%v", err)
		})
	}
	// What encoding/json accepted still reads: keys in any case, unknown
	// keys, null ops, a later duplicate winning.
	k, err := trace.ReadKernels(strings.NewReader(`{"Format":"optrace-kernels/v1","note":{"a":[1,{"b":"]"}]},"ops":[{"seq":0}],"MODEL":"m","ops":null,"seq_len":8}`), "k.json")
	require.NoError(t, err)
	assert.Equal(t, &trace.Kernels{Model: "m", SeqLen: 8}, k)
	_, err = trace.ReadKernels(bytes.NewReader([]byte{0x1f, 0x8b, 1}), "k.json.gz")
	assert.True(t, errors.As(err, new(*trace.ParseError)), "%v", err)
}
