package pytorch

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stream is a document made as it is read, so that a test can feed the
// importer gigabytes without holding them: head, then n copies of chunk,
// then tail. read counts the bytes handed out.
type stream struct {
	head, tail []byte
	chunk      []byte
	n          int
	cur        []byte
	read       int64
}

func newStream(head string, chunk []byte, n int, tail string) *stream {
	return &stream{head: []byte(head), chunk: chunk, n: n, tail: []byte(tail)}
}

func (s *stream) Read(p []byte) (int, error) {
	for len(s.cur) == 0 {
		switch {
		case s.head != nil:
			s.cur, s.head = s.head, nil
		case s.n > 0:
			s.cur = s.chunk
			s.n--
		case s.tail != nil:
			s.cur, s.tail = s.tail, nil
		default:
			return 0, io.EOF
		}
	}
	n := copy(p, s.cur)
	s.cur = s.cur[n:]
	s.read += int64(n)
	return n, nil
}

// peakHeap runs f and returns how far the heap grew above where it stood
// before, sampled every millisecond while f ran (garbage not yet collected
// included), and how long f took.
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

var mibOf = func(c string) []byte { return []byte(strings.Repeat(c, 1<<20)) }

// A gigabyte string in one node or event (a 1 MB gzip) is refused once
// MaxValueBytes of it are read, naming the file and the node or event; the
// importer took 3.2 to 4.2 GB and 13 to 18 s for one before the cap.
func TestHugeValueFailsAtTheCap(t *testing.T) {
	a, blanks := mibOf("a"), mibOf(" ")
	tests := []struct {
		name     string
		et, k    *stream
		file     string
		want     string
		maxBytes int64 // read of the hostile file at most
	}{
		{
			name: "node name",
			et:   newStream(`{"nodes":[{"id":1,"name":"`, a, 1<<10, `"}]}`), k: newStream(seedKineto, nil, 0, ""),
			file: "et.json", want: `et.json: nodes[0]: value longer than 8388608 bytes`,
		},
		{
			name: "event name",
			et:   newStream(seedET, nil, 0, ""), k: newStream(`{"traceEvents":[{"ph":"X","cat":"cpu_op","ts":1,"dur":1,"name":"`, a, 1<<10, `"}]}`),
			file: "k.json", want: `k.json: traceEvents[0]: value longer than 8388608 bytes`,
		},
		{
			name: "skipped key",
			et:   newStream(`{"pid":"`, a, 1<<10, `","nodes":[]}`), k: newStream(seedKineto, nil, 0, ""),
			file: "et.json", want: `et.json: in "pid": value longer than 8388608 bytes`,
		},
		{
			name: "attrs",
			et:   newStream(`{"nodes":[{"id":1,"name":"aten::mm","attrs":[{}`, []byte(strings.Repeat(",{}", 1<<18)), 1<<10, `]}]}`), k: newStream(seedKineto, nil, 0, ""),
			file: "et.json", want: `et.json: nodes[0]: value longer than 8388608 bytes`,
		},
		{
			name: "device name",
			et:   newStream(seedET, nil, 0, ""), k: newStream(`{"deviceProperties":[{"name":"`, a, 1<<10, `"}],"traceEvents":[]}`),
			file: "k.json", want: `k.json: deviceProperties[0]: value longer than 8388608 bytes`,
		},
		{
			// Blanks are cut before they count, but not before they are
			// read: a gigabyte of them is the file's cap.
			name: "blanks",
			et:   newStream(`{"nodes":[`, blanks, 1<<10+1, `]}`), k: newStream(seedKineto, nil, 0, ""),
			file: "et.json", want: `et.json: in "nodes": file longer than 1073741824 bytes`,
			maxBytes: MaxInputBytes,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.maxBytes > MaxValueBytes && (testing.Short() || raceEnabled) {
				t.Skip("reads a gigabyte")
			}
			var err error
			peak, took := peakHeap(func() { _, err = Load(tt.et, "et.json", tt.k, "k.json") })
			var pe *ParseError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tt.file, pe.File)
			assert.Contains(t, err.Error(), tt.want)
			hostile := tt.et
			if tt.file == "k.json" {
				hostile = tt.k
			}
			// Read: the cap, the buffers ahead of the decoder and the
			// prefix.
			assert.Less(t, hostile.read, max(tt.maxBytes, MaxValueBytes)+1<<20)
			assert.Less(t, peak, uint64(64<<20), "heap grew %d MiB", peak>>20)
			t.Logf("%d MiB read: heap grew %d MiB, %v", hostile.read>>20, peak>>20, took)
		})
	}
}

// The same through gzip: the writer stops a deflate block past the cap.
func TestHugeGzipValueFailsAtTheCap(t *testing.T) {
	pr, pw := io.Pipe()
	done := make(chan int64, 1)
	go func() {
		zw := gzip.NewWriter(pw)
		n, err := io.Copy(zw, newStream(`{"nodes":[{"id":1,"name":"`, mibOf("a"), 1<<10, `"}]}`))
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
		done <- n
	}()
	_, err := Load(pr, "et.json.gz", strings.NewReader(seedKineto), "k.json")
	pr.CloseWithError(io.ErrClosedPipe)
	written := <-done
	require.Error(t, err)
	assert.Contains(t, err.Error(), "et.json.gz: nodes[0]: value longer than 8388608 bytes")
	assert.Less(t, written, int64(2*MaxValueBytes))
}

// Lists inside a node are counted before they are decoded.
func TestListCaps(t *testing.T) {
	over := MaxListLen + 1
	list := func(elem string) string { return strings.Repeat(elem+",", over-1) + elem }
	tensor := `[1,2,0,4,4,"cuda:0"]`
	tests := []struct {
		name, et, k, want string
	}{
		{"attrs", `{"nodes":[{"id":1,"name":"aten::mm","attrs":[` + list("{}") + `]}]}`, seedKineto,
			`et.json: nodes[0]: field "attrs": a list of 65537 elements, more than the 65536 allowed`},
		{"values", `{"nodes":[{"id":1,"name":"aten::mm","inputs":{"values":[` + list("0") + `],"types":[]}}]}`, seedKineto,
			`et.json: node 1: field "inputs": a list of 65537 elements`},
		{"flat values", `{"nodes":[{"id":1,"name":"aten::mm","outputs":[` + list("0") + `]}]}`, seedKineto,
			`et.json: node 1: field "outputs": a list of 65537 elements`},
		{"tensor list", `{"nodes":[{"id":1,"name":"aten::mm","inputs":{"values":[[` + list(tensor) + `]],"types":["GenericList[Tensor(float)]"]}}]}`, seedKineto,
			`et.json: node 1: field "inputs.values[0]": a list of 65537 elements`},
		{"tensor parts", `{"nodes":[{"id":1,"name":"aten::mm","inputs":{"values":[[` + list("1") + `]],"types":["Tensor(float)"]}}]}`, seedKineto,
			`field "inputs.values[0]": want 6 elements [tensor_id, storage_id, offset, numel, itemsize, device], got 65537`},
		{"devices", seedET, `{"deviceProperties":[` + list(`{"name":"d"}`) + `],"traceEvents":[]}`,
			`k.json: deviceProperties: more than 65536 devices`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			peak, _ := peakHeap(func() { _, err = Load(strings.NewReader(tt.et), "et.json", strings.NewReader(tt.k), "k.json") })
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Less(t, peak, uint64(32<<20), "heap grew %d MiB", peak>>20)
		})
	}
	// A shape past trace.MaxShapeDims is read as no shape, as one that is
	// not a list of integers is.
	assert.Nil(t, dims([]byte("["+list("1")+"]")))
	assert.Equal(t, []int64{2, 3}, dims([]byte(" [2, 3] ")))
}

// The distinct strings of a file are bounded in count and in bytes.
func TestStringCaps(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`{"nodes":[`)
	x := strings.Repeat("x", 1<<20)
	for i := range 9 {
		fmt.Fprintf(&b, `{"id":%d,"name":"%d%s"},`, i, i, x)
	}
	b.WriteString(`{"id":99,"name":"aten::mm"}]}`)
	_, err := Load(&b, "et.json", strings.NewReader(seedKineto), "k.json")
	var pe *ParseError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, ParseError{File: "et.json", Where: "node 7", Field: "name"}, ParseError{File: pe.File, Where: pe.Where, Field: pe.Field}, "%v", err)
	assert.Contains(t, err.Error(), "bytes of distinct strings, more than the 8388608 allowed")

	b.Reset()
	b.WriteString(`{"nodes":[`)
	for i := range MaxStrings + 1 {
		fmt.Fprintf(&b, `{"id":%d,"name":"n%d"},`, i, i)
	}
	b.WriteString(`{"id":-1,"name":"aten::mm"}]}`)
	_, err = Load(&b, "et.json", strings.NewReader(seedKineto), "k.json")
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, fmt.Sprintf("node %d", MaxStrings), pe.Where)
	assert.Contains(t, err.Error(), "more than 65536 distinct strings")
}
