package pytorch

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func squeeze(t testing.TB, in string, chunk int) string {
	t.Helper()
	out, err := io.ReadAll(newSqueezer(&chunked{r: strings.NewReader(in), n: chunk}))
	require.NoError(t, err)
	return string(out)
}

// chunked returns at most n bytes per Read, to cross runs and strings over
// read boundaries.
type chunked struct {
	r io.Reader
	n int
}

func (c *chunked) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

func TestSqueezer(t *testing.T) {
	tests := []struct{ give, want string }{
		{give: `{"a": 1}`, want: `{"a": 1}`},
		{give: "{ \n\t \"a\" :\r\n  [1,   2]  }  \n", want: "{ \"a\" :\r[1, 2] } "},
		{give: `{"a   b": "x \" \\  y"}`, want: `{"a   b": "x \" \\  y"}`},
		{give: `"\\"   ""`, want: `"\\" ""`},
		{give: `1    2`, want: `1 2`}, // still two values: still refused
		{give: "   ", want: " "},
		{give: "", want: ""},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 2, 3, 1 << 16} {
			assert.Equal(t, tt.want, squeeze(t, tt.give, chunk), "%q in chunks of %d", tt.give, chunk)
		}
	}
}

// spread puts n bytes of white space into every gap of a JSON document that
// json.Marshal wrote: after each '[', ',' and ':' outside strings, and at
// the end.
func spread(doc []byte, n int) []byte {
	ws := bytes.Repeat([]byte(" \n\t"), n/3+1)[:n]
	var out bytes.Buffer
	inStr, esc := false, false
	for _, c := range doc {
		out.WriteByte(c)
		switch {
		case inStr:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
		case c == '"':
			inStr = true
		case c == '[' || c == ',' || c == ':':
			out.Write(ws)
		}
	}
	out.Write(ws)
	return out.Bytes()
}

// The decoders see at most one byte of any run of white space, so what
// encoding/json's Decoder buffers and scans again on each refill no longer
// grows with the blanks: the import is linear in the input. The import of
// a document with megabytes of blanks gives what the compact one gives.
func TestWhitespaceIsSqueezedBeforeDecoding(t *testing.T) {
	et, k := smallET(smallNodes, false), smallKineto(0)
	want := loadSmall(t, et, k)
	blanks := func(n int) []byte { return bytes.Repeat([]byte(" \n\t\r"), n/4) }
	after := func(doc []byte, key string, n int) []byte {
		i := bytes.Index(doc, []byte(key)) + len(key)
		return slices.Concat(doc[:i], blanks(n), doc[i:])
	}
	tests := []struct {
		name  string
		et, k []byte
		gzip  bool
	}{
		{name: "every gap", et: spread(et, 1000), k: spread(k, 1000)},
		{name: "nodes", et: after(et, `"nodes":[`, 4<<20), k: after(k, `"traceEvents":[`, 4<<20)},
		{name: "nodes gzip", et: after(et, `"nodes":[`, 4<<20), k: after(k, `"traceEvents":[`, 4<<20), gzip: true},
		{name: "inside a node", et: after(et, `"inputs":`, 4<<20), k: k},
		{name: "after the document", et: slices.Concat(et, blanks(4<<20)), k: slices.Concat(k, blanks(4<<20))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// What reaches the decoder: the compact document plus at most
			// one byte per gap.
			for _, doc := range [][]byte{tt.et, tt.k} {
				got, err := io.ReadAll(newSqueezer(bytes.NewReader(doc)))
				require.NoError(t, err)
				assert.LessOrEqual(t, len(got), len(spread(et, 1))+len(spread(k, 1)))
			}
			if tt.gzip {
				tt.et, tt.k = gz(tt.et), gz(tt.k)
			}
			res := loadSmall(t, tt.et, tt.k)
			assert.Equal(t, want.Trace.Iterations[0].Ops, res.Trace.Iterations[0].Ops)
			assert.Equal(t, want.Ops, res.Ops)
		})
	}
	// Megabytes of blanks where the nodes list should close: still an
	// unfinished document.
	bad := after([]byte(`{"nodes": [`), `[`, 4<<20)
	_, err := Load(bytes.NewReader(bad), "ws.et.json", bytes.NewReader(k), "k.json")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ws.et.json")
	assert.Contains(t, err.Error(), "truncated")
}

// BenchmarkImportWhitespace imports the small step, gzip-compressed as
// real traces are, with n MiB of blanks after "nodes":[. gzip hands the
// decoder at most a window per read, and without the squeezer every read
// rescanned all the blanks so far: 4, 8 and 16 MiB took 0.4, 1.1 and 4.9 s.
// Linear, MB/s stays flat as n grows.
func BenchmarkImportWhitespace(b *testing.B) {
	et, k := smallET(smallNodes, false), smallKineto(0)
	i := bytes.Index(et, []byte(`"nodes":[`)) + len(`"nodes":[`)
	for _, mib := range []int{4, 8, 16} {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			doc := slices.Concat(et[:i], bytes.Repeat([]byte{' '}, mib<<20), et[i:])
			zdoc := gz(doc)
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				if _, err := Load(bytes.NewReader(zdoc), "et.gz", bytes.NewReader(k), "k"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
