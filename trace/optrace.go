package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/chameleon-go/chameleon/trace/internal/jsonio"
)

// FormatOptrace is the format string of an optrace/v1 header.
const FormatOptrace = "optrace/v1"

// ParseError is bad input: it names the file, the line (from 1) and the
// field that could not be read.
type ParseError struct {
	File  string
	Line  int
	Field string // empty when the line itself is malformed
	Err   error
}

func (e *ParseError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: field %q: %v", e.File, e.Line, e.Field, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// ErrTruncated is returned (wrapped in a ParseError) when a trace ends before
// its footer: a cut-off file must never read as a shorter trace.
var ErrTruncated = errors.New("trace ends early (no footer): file truncated?")

// Limits of the optrace/v1 reader. Input beyond one is refused with a
// ParseError naming the line and the field, so that a damaged or hostile
// file costs memory in proportion to what it legitimately holds and no size
// that overflows int64 arithmetic reaches later stages. The per-line limits
// bound what one line costs, the per-file ones (MaxFile...) what a whole
// file costs however it is cut into lines: a small gzip file can inflate to
// gigabytes of valid lines. At every cap together a file costs the reader
// well under 1 GiB. They sit far above what real recordings reach: in the
// traces of Llama (up to 7B layer shapes, LoRA, checkpointing, fp16 scaler,
// decode), Mixtral, GPT-2 and Qwen2 recorded on an H200, the longest line is
// 7,142 bytes (a foreach optimizer op), shapes have at most 4 dims, an op has
// at most 1,460 inputs and 8 outputs, the largest storage is 2.1 GB and the
// largest allocated-bytes value 34.5 GB; the largest file holds 12.4 MB
// (decompressed), 25,541 storages with 74,794 dims in all, 48,069 ops
// making 109,596 tensor references, 49 iterations, and 1,802 distinct
// strings of 114,028 bytes in all.
const (
	// MaxLineBytes bounds one line (16 MiB). A longer line is refused after
	// reading at most this much of it.
	MaxLineBytes = 16 << 20
	// MaxShapeDims bounds the dims of a tensor's shape (NumPy's own limit
	// is 64).
	MaxShapeDims = 64
	// MaxOpTensors bounds each of an op's in and out lists: a million
	// tensor ids still fit a line.
	MaxOpTensors = 1 << 20
	// MaxBytes bounds a storage size (bytes), a recorded allocated-bytes
	// value (mem) and an iteration's peak (peak_bytes): 4 TiB, more than any
	// accelerator holds, and small enough that a sum over a million
	// storages cannot overflow int64.
	MaxBytes = 4 << 40

	// MaxFileBytes bounds the size of a file, decompressed (1 GiB, 86 times
	// the largest real one). The reader stops reading there, so a small
	// gzip of blank lines cannot keep it busy for minutes.
	MaxFileBytes = 1 << 30
	// MaxFileTensors bounds the storages a file declares (20 times the
	// largest real count).
	MaxFileTensors = 1 << 19
	// MaxFileDims bounds the shape dims of all the storages a file declares
	// together (28 times the largest real count; 4 a storage at
	// MaxFileTensors, where real ones have 2.9).
	MaxFileDims = 1 << 21
	// MaxFileOps bounds the ops of a file, all iterations together (21
	// times the largest real count).
	MaxFileOps = 1 << 20
	// MaxFileRefs bounds the tensor references of a file: the lengths of
	// the in and out lists of all its ops together (38 times the largest
	// real count). An in list may hold MaxOpTensors of them: four such
	// lines fill the cap.
	MaxFileRefs = 1 << 22
	// MaxFileIterations bounds the iterations of a file, and so the length
	// of the footer's list of iteration times.
	MaxFileIterations = 1 << 16
	// MaxFileStrings and MaxFileStringBytes bound the distinct strings a
	// file holds (36 and 73 times the largest real figures): the op names,
	// overloads, module paths and dtypes, each kept once however often it
	// is repeated, and the header's strings and config.
	MaxFileStrings     = 1 << 16
	MaxFileStringBytes = 8 << 20
)

// Limits on the times a trace records and the costs it declares, in
// optrace/v1 and optrace-kernels/v1 alike. Each must be a number in [0,
// its cap]: a negative or absurd one would reach the planner and the
// reports as a negative iteration time or an op that takes longer than the
// age of the universe. They sit far above what real recordings reach: in
// the traces recorded on an H200 the longest iteration takes 2,408.5 ms
// (instrumented), the longest op 62,781.7 µs (dur_us) and the longest
// kernel time of an op 10,765.5 µs; no op declares FLOPs or bytes.
const (
	// MaxIterMS bounds an iteration's times, in milliseconds: an optrace's
	// wall_ms, uninstrumented_ms and the footer's uninstrumented_iter_ms, a
	// kernels file's iteration_ms and kernel_ms_total. A day.
	MaxIterMS = 24 * 60 * 60 * 1000
	// MaxOpUS bounds an op's time, in microseconds: an optrace's dur_us, a
	// kernels file's kernel_us. An hour.
	MaxOpUS = 60 * 60 * 1000 * 1000
	// MaxOpFLOPs bounds the FLOPs an op declares (flops): 1e21, more than
	// any accelerator today runs in an hour (an H200 runs some 1e15 a
	// second).
	MaxOpFLOPs = 1e21
	// MaxOpIOBytes bounds the bytes an op declares it moves (io_bytes):
	// 1e18, more than any accelerator's memory moves in an hour (an H200's
	// 4.8 TB/s move 1.7e16).
	MaxOpIOBytes = 1e18
)

// checkRange says why x is not a number in [0, hi], nil when it is; unit
// is what x counts ("ms", "µs", "" for none), what says what hi is ("a
// day").
func checkRange(x, hi float64, unit, what string) error {
	u := ""
	if unit != "" {
		u = " " + unit
	}
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return fmt.Errorf("%g: not a finite number", x)
	case x < 0:
		return fmt.Errorf("negative: %g%s", x, u)
	case x > hi:
		return fmt.Errorf("%g%s, more than %s (%g%s)", x, u, what, hi, u)
	}
	return nil
}

// Reader streams an optrace/v1 trace one iteration at a time, so only the
// iteration being read and the table of declared storages are in memory.
// It refuses input beyond MaxLineBytes, MaxShapeDims, MaxOpTensors,
// MaxBytes and the per-file limits (MaxFileBytes, MaxFileTensors,
// MaxFileDims, MaxFileOps, MaxFileRefs, MaxFileIterations, MaxFileStrings,
// MaxFileStringBytes); ReadFile and Read hold a whole file within them. It
// refuses values that make nonsense too: iteration indices that are
// negative, repeat or go back (they must increase through the file; gaps
// are allowed), and times and costs outside [0, MaxIterMS] ms (wall_ms,
// uninstrumented_ms, uninstrumented_iter_ms), [0, MaxOpUS] µs (dur_us),
// [0, MaxOpFLOPs] (flops) and [0, MaxOpIOBytes] (io_bytes).
type Reader struct {
	name    string
	br      *bufio.Reader
	closers []io.Closer
	line    int
	buf     []byte
	hdr     Header
	tensors map[TensorID]*Tensor
	footer  []float64
	done    bool
	raw     rawLine
	strs    map[string]string
	// What the file has held so far, against the MaxFile limits.
	nDims, nOps, nRefs, nIters, strBytes int
	// The index of the last iteration and the line it started on: indices
	// must increase.
	lastIter, lastIterLine int
}

// intern returns one shared copy of each distinct name: a trace repeats a
// few hundred op names and module paths thousands of times, and consumers
// (the encoder's pointer cache) profit from equal names being one string.
// A name that is new counts against MaxFileStrings and MaxFileStringBytes;
// field names it in the error.
func (r *Reader) intern(field, s string) (string, error) {
	if v, ok := r.strs[s]; ok {
		return v, nil
	}
	if len(r.strs) >= MaxFileStrings {
		return "", r.errf(field, "more than %d distinct strings in the file", MaxFileStrings)
	}
	if err := r.countString(field, len(s)); err != nil {
		return "", err
	}
	r.strs[s] = s
	return s, nil
}

// countString counts n bytes of strings kept against MaxFileStringBytes.
func (r *Reader) countString(field string, n int) error {
	if r.strBytes+n > MaxFileStringBytes {
		return r.errf(field, "%d bytes of distinct strings, more than the %d allowed in a file", r.strBytes+n, MaxFileStringBytes)
	}
	r.strBytes += n
	return nil
}

// clip shortens a string quoted in an error: the line it came from may
// hold megabytes of it.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// rawLine is the union of every optrace/v1 line. Pointers mark the fields
// whose absence must be told apart from zero.
type rawLine struct {
	Type string `json:"type"`
	// header
	Format string          `json:"format"`
	Model  string          `json:"model"`
	Config json.RawMessage `json:"config"`
	Batch  int             `json:"batch"`
	AMP    json.RawMessage `json:"amp"`
	Ckpt   bool            `json:"ckpt"`
	Device string          `json:"device"`
	Torch  string          `json:"torch"`
	Params int64           `json:"params"`
	// tensor
	ID     *int64  `json:"id"`
	Bytes  *int64  `json:"bytes"`
	DType  string  `json:"dtype"`
	Shape  dimList `json:"shape"`
	Kind   string  `json:"kind"`
	Ptr    uint64  `json:"ptr"`
	Frozen bool    `json:"frozen"`
	// op (seq doubles as the header's sequence length)
	Iter     *int     `json:"iter"`
	Seq      *int     `json:"seq"`
	Name     string   `json:"name"`
	Overload string   `json:"overload"`
	Phase    string   `json:"phase"`
	Module   string   `json:"module"`
	In       inList   `json:"in"`
	Out      outList  `json:"out"`
	DurUS    *float64 `json:"dur_us"`
	Mem      *int64   `json:"mem"`
	FLOPs    float64  `json:"flops"`
	IOBytes  float64  `json:"io_bytes"`
	// iter_end
	Ops       *int    `json:"ops"`
	SeqLen    int     `json:"seq_len"`
	PeakBytes *int64  `json:"peak_bytes"`
	WallMS    float64 `json:"wall_ms"`
	UninstMS  float64 `json:"uninstrumented_ms"`
	// footer
	IterMS floatList `json:"uninstrumented_iter_ms"`
}

// Open opens a trace file, gzip-compressed or plain (told by its first
// bytes), and reads its header.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, err := newReader(f, filepath.Base(path), f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// NewReader reads a trace from r, gzip-compressed or plain. name is used in
// error messages.
func NewReader(r io.Reader, name string) (*Reader, error) { return newReader(r, name, nil) }

func newReader(r io.Reader, name string, c io.Closer) (*Reader, error) {
	rd := &Reader{name: name, tensors: make(map[TensorID]*Tensor), strs: make(map[string]string), lastIter: -1}
	if c != nil {
		rd.closers = append(rd.closers, c)
	}
	size := 1 << 16
	if l, ok := r.(interface{ Len() int }); ok {
		// An in-memory input (bytes.Reader, strings.Reader) shorter than
		// the buffer: small ones are read often (tests, fuzzing), and
		// allocating 64 KiB each time is most of their cost.
		size = min(size, max(l.Len(), 16))
	}
	// Plain input is limited as it is read, gzip input once decompressed.
	raw := &jsonio.Limit{R: r, Max: MaxFileBytes}
	br := bufio.NewReaderSize(raw, size)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		raw.Max = math.MaxInt64
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, &ParseError{File: name, Line: 0, Err: fmt.Errorf("gzip: %w", err)}
		}
		rd.closers = append(rd.closers, zr)
		br = bufio.NewReaderSize(&jsonio.Limit{R: zr, Max: MaxFileBytes}, 1<<16)
	}
	rd.br = br
	if err := rd.readHeader(); err != nil {
		return nil, err
	}
	return rd, nil
}

// Name is the name used in errors (the file's base name for Open).
func (r *Reader) Name() string { return r.name }

// Header returns the trace header.
func (r *Reader) Header() Header { return r.hdr }

// Close releases the file.
func (r *Reader) Close() error {
	var first error
	for i := len(r.closers) - 1; i >= 0; i-- {
		if err := r.closers[i].Close(); err != nil && first == nil {
			first = err
		}
	}
	r.closers = nil
	return first
}

func (r *Reader) errf(field string, format string, args ...any) error {
	return &ParseError{File: r.name, Line: r.line, Field: field, Err: fmt.Errorf(format, args...)}
}

// next reads and decodes the next non-empty line into r.raw; io.EOF at a
// clean end of input.
func (r *Reader) next() error {
	for {
		// The line and its integer lists (most lines have an in or out list)
		// go into the last line's arrays. A large one is kept while lines
		// as long follow, and dropped after one a quarter its size: not
		// kept for the whole file after one long line, not grown again for
		// each of many.
		r.buf = reuse(r.buf, 1<<20)
		in, out := reuse(r.raw.In, 1<<12), reuse(r.raw.Out, 1<<12)
		for {
			chunk, err := r.br.ReadSlice('\n')
			if len(r.buf)+len(chunk) > MaxLineBytes {
				r.line++
				return &ParseError{File: r.name, Line: r.line, Err: fmt.Errorf("line longer than %d bytes", MaxLineBytes)}
			}
			if len(r.buf)+len(chunk) > cap(r.buf) {
				// Double: append's slower growth of large slices would
				// allocate five times the line on the way to the cap.
				nb := make([]byte, len(r.buf), min(2*cap(r.buf)+len(chunk), MaxLineBytes))
				copy(nb, r.buf)
				r.buf = nb
			}
			r.buf = append(r.buf, chunk...)
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				if len(r.buf) == 0 {
					return io.EOF
				}
				break
			}
			if err != nil {
				r.line++
				var tl *jsonio.TooLargeError
				if errors.As(err, &tl) {
					return &ParseError{File: r.name, Line: r.line, Err: fmt.Errorf("file longer than %d bytes (decompressed)", MaxFileBytes)}
				}
				return &ParseError{File: r.name, Line: r.line, Err: fmt.Errorf("read: %w", err)}
			}
			break
		}
		r.line++
		line := bytes.TrimSpace(r.buf)
		if len(line) == 0 {
			continue
		}
		r.raw = rawLine{In: in, Out: out}
		if err := json.Unmarshal(line, &r.raw); err != nil {
			var te *json.UnmarshalTypeError
			var le *listError
			if errors.As(err, &le) {
				return &ParseError{File: r.name, Line: r.line, Field: le.field, Err: fmt.Errorf("%d elements, more than the %d allowed", le.n, le.max)}
			}
			if errors.As(err, &te) {
				return &ParseError{File: r.name, Line: r.line, Field: te.Field, Err: fmt.Errorf("want %s, got JSON %s", te.Type, te.Value)}
			}
			return &ParseError{File: r.name, Line: r.line, Err: err}
		}
		return nil
	}
}

// reuse empties s for the next line, nil when s is larger than small and
// the line it held used less than a quarter of it.
func reuse[T any](s []T, small int) []T {
	if cap(s) > small && len(s) < cap(s)/4 {
		return nil
	}
	return s[:0]
}

func (r *Reader) readHeader() error {
	err := r.next()
	if err == io.EOF {
		return &ParseError{File: r.name, Line: r.line, Err: errors.New("empty trace: no header")}
	}
	if err != nil {
		return err
	}
	l := &r.raw
	if l.Type != "header" {
		return r.errf("type", "first line must be the header, got %q", clip(l.Type))
	}
	if l.Format != FormatOptrace {
		return r.errf("format", "unsupported format %q (want %q)", clip(l.Format), FormatOptrace)
	}
	var amp string
	if len(l.AMP) > 0 && l.AMP[0] == '"' {
		_ = json.Unmarshal(l.AMP, &amp)
	}
	seq := 0
	if l.Seq != nil {
		seq = *l.Seq
	}
	r.hdr = Header{
		Format: l.Format, Model: l.Model, Batch: l.Batch, Seq: seq, AMP: amp,
		Ckpt: l.Ckpt, Device: l.Device, Torch: l.Torch, Params: l.Params,
	}
	if len(l.Config) > 0 && string(l.Config) != "null" {
		r.hdr.Config = bytes.Clone(l.Config)
	}
	for _, f := range []struct {
		field string
		n     int
	}{{"model", len(l.Model)}, {"amp", len(amp)}, {"device", len(l.Device)}, {"torch", len(l.Torch)}, {"config", len(r.hdr.Config)}} {
		if err := r.countString(f.field, f.n); err != nil {
			return err
		}
	}
	return nil
}

// Next returns the next iteration, or io.EOF after the footer. Storages
// declared by earlier iterations (parameters, optimizer state) are shared
// with later ones.
func (r *Reader) Next() (*Iteration, error) {
	if r.done {
		return nil, io.EOF
	}
	var it *Iteration
	var ids []TensorID // a block of the iteration's tensor refs, sliced per op
	for {
		err := r.next()
		if err == io.EOF {
			return nil, &ParseError{File: r.name, Line: r.line, Err: ErrTruncated}
		}
		if err != nil {
			return nil, err
		}
		l := &r.raw
		switch l.Type {
		case "tensor":
			if err := r.tensor(l); err != nil {
				return nil, err
			}
		case "op":
			if l.Iter == nil {
				return nil, r.errf("iter", "missing")
			}
			if it == nil {
				if it, err = r.newIteration(*l.Iter); err != nil {
					return nil, err
				}
			} else if *l.Iter != it.Index {
				return nil, r.errf("iter", "op of iteration %d inside iteration %d (missing iter_end?)", *l.Iter, it.Index)
			}
			if err := r.op(l, it, &ids); err != nil {
				return nil, err
			}
		case "iter_end":
			if l.Iter == nil {
				return nil, r.errf("iter", "missing")
			}
			if it == nil {
				if it, err = r.newIteration(*l.Iter); err != nil {
					return nil, err
				}
			}
			if *l.Iter != it.Index {
				return nil, r.errf("iter", "iter_end of iteration %d closes iteration %d", *l.Iter, it.Index)
			}
			if l.Ops == nil {
				return nil, r.errf("ops", "missing")
			}
			if *l.Ops != len(it.Ops) {
				return nil, r.errf("ops", "says %d ops, the iteration has %d", *l.Ops, len(it.Ops))
			}
			if p := l.PeakBytes; p != nil && (*p < 0 || *p > MaxBytes) {
				return nil, r.errf("peak_bytes", "%d outside [0, %d]", *p, int64(MaxBytes))
			}
			for _, f := range []struct {
				field string
				v     float64
			}{{"wall_ms", l.WallMS}, {"uninstrumented_ms", l.UninstMS}} {
				if err := checkRange(f.v, MaxIterMS, "ms", "a day"); err != nil {
					return nil, &ParseError{File: r.name, Line: r.line, Field: f.field, Err: err}
				}
			}
			it.SeqLen, it.WallMS, it.TimeMS = l.SeqLen, l.WallMS, l.UninstMS
			if l.PeakBytes != nil {
				it.PeakBytes = *l.PeakBytes
			}
			return it, nil
		case "footer":
			if it != nil {
				return nil, r.errf("type", "footer inside iteration %d (missing iter_end)", it.Index)
			}
			for i, v := range l.IterMS {
				if err := checkRange(v, MaxIterMS, "ms", "a day"); err != nil {
					return nil, r.errf("uninstrumented_iter_ms", "element %d: %v", i, err)
				}
			}
			r.footer = append([]float64(nil), l.IterMS...)
			r.done = true
			// Read to the end: the gzip checksum is only checked there, and
			// anything after the footer is a damaged or concatenated file.
			switch err := r.next(); {
			case err == io.EOF:
				return nil, io.EOF
			case err != nil:
				return nil, err
			default:
				return nil, r.errf("type", "%q line after the footer", clip(r.raw.Type))
			}
		case "header":
			return nil, r.errf("type", "second header")
		default:
			return nil, r.errf("type", "unknown line type %q", clip(l.Type))
		}
	}
}

// newIteration starts iteration index, counting it against
// MaxFileIterations. Indices must increase through the file (gaps are
// allowed: a recorder may leave iterations out), so that each names one
// iteration and the order of the file is the order of the run.
func (r *Reader) newIteration(index int) (*Iteration, error) {
	switch {
	case index < 0:
		return nil, r.errf("iter", "negative iteration index %d", index)
	case index == r.lastIter:
		return nil, r.errf("iter", "iteration %d again (it started at line %d): each iteration is recorded once", index, r.lastIterLine)
	case index < r.lastIter:
		return nil, r.errf("iter", "iteration %d after iteration %d (line %d): indices must increase", index, r.lastIter, r.lastIterLine)
	}
	if r.nIters >= MaxFileIterations {
		return nil, r.errf("iter", "more than %d iterations in the file", MaxFileIterations)
	}
	r.nIters++
	r.lastIter, r.lastIterLine = index, r.line
	return &Iteration{Index: index, Tensors: make(map[TensorID]*Tensor)}, nil
}

func (r *Reader) tensor(l *rawLine) error {
	if l.ID == nil {
		return r.errf("id", "missing")
	}
	id := TensorID(*l.ID)
	if id < 0 {
		return r.errf("id", "negative id %d", id)
	}
	if _, dup := r.tensors[id]; dup {
		return r.errf("id", "tensor %d declared twice", id)
	}
	if len(r.tensors) >= MaxFileTensors {
		return r.errf("id", "more than %d tensors declared in the file", MaxFileTensors)
	}
	if l.Bytes == nil {
		return r.errf("bytes", "missing")
	}
	if *l.Bytes < 0 {
		return r.errf("bytes", "negative size %d", *l.Bytes)
	}
	if *l.Bytes > MaxBytes {
		return r.errf("bytes", "size %d above the %d-byte limit", *l.Bytes, int64(MaxBytes))
	}
	for i, d := range l.Shape {
		if d < 0 {
			return r.errf("shape", "dim %d is %d", i, d)
		}
	}
	if r.nDims+len(l.Shape) > MaxFileDims {
		return r.errf("shape", "%d shape dims in the file, more than the %d allowed", r.nDims+len(l.Shape), MaxFileDims)
	}
	kind, ok := ParseKind(l.Kind)
	if !ok {
		return r.errf("kind", "unknown tensor kind %q", clip(l.Kind))
	}
	if l.Frozen && kind != KindParam {
		return r.errf("frozen", "set on a %s tensor; only a param can be frozen", l.Kind)
	}
	dtype, err := r.intern("dtype", l.DType)
	if err != nil {
		return err
	}
	r.nDims += len(l.Shape)
	r.tensors[id] = &Tensor{
		ID: id, Bytes: *l.Bytes, DType: dtype, Shape: append([]int64(nil), l.Shape...),
		Kind: kind, Ptr: l.Ptr, Frozen: l.Frozen, Line: r.line,
	}
	return nil
}

func (r *Reader) op(l *rawLine, it *Iteration, ids *[]TensorID) error {
	if l.Seq == nil {
		return r.errf("seq", "missing")
	}
	if *l.Seq != len(it.Ops) {
		return r.errf("seq", "op %d out of order (want %d)", *l.Seq, len(it.Ops))
	}
	if l.Name == "" {
		return r.errf("name", "missing")
	}
	if r.nOps >= MaxFileOps {
		return r.errf("", "more than %d ops in the file", MaxFileOps)
	}
	phase, ok := ParsePhase(l.Phase)
	if !ok {
		return r.errf("phase", "unknown phase %q", clip(l.Phase))
	}
	in, err := r.refs(l.In, it, ids, "in")
	if err != nil {
		return err
	}
	out, err := r.refs(l.Out, it, ids, "out")
	if err != nil {
		return err
	}
	var names [3]string
	for i, f := range []struct{ field, s string }{{"name", l.Name}, {"overload", l.Overload}, {"module", l.Module}} {
		if names[i], err = r.intern(f.field, f.s); err != nil {
			return err
		}
	}
	op := Op{
		Seq: *l.Seq, Name: names[0], Overload: names[1], Phase: phase, Module: names[2],
		In: in, Out: out, Mem: -1, FLOPs: l.FLOPs, IOBytes: l.IOBytes, Line: r.line,
	}
	if l.DurUS != nil {
		if err := checkRange(*l.DurUS, MaxOpUS, "µs", "an hour"); err != nil {
			return &ParseError{File: r.name, Line: r.line, Field: "dur_us", Err: err}
		}
		op.DurUS = *l.DurUS
	}
	if err := checkRange(l.FLOPs, MaxOpFLOPs, "", "the FLOPs an op may declare"); err != nil {
		return &ParseError{File: r.name, Line: r.line, Field: "flops", Err: err}
	}
	if err := checkRange(l.IOBytes, MaxOpIOBytes, "bytes", "the bytes an op may declare"); err != nil {
		return &ParseError{File: r.name, Line: r.line, Field: "io_bytes", Err: err}
	}
	if l.Mem != nil {
		if *l.Mem < 0 {
			return r.errf("mem", "negative %d", *l.Mem)
		}
		if *l.Mem > MaxBytes {
			return r.errf("mem", "%d above the %d-byte limit", *l.Mem, int64(MaxBytes))
		}
		op.Mem = *l.Mem
	}
	if len(it.Ops) > 0 && (it.Ops[0].Mem >= 0) != (op.Mem >= 0) {
		return r.errf("mem", "present on some ops of iteration %d and not on others", it.Index)
	}
	it.Ops = append(it.Ops, op)
	r.nOps++
	return nil
}

func (r *Reader) refs(raw []int64, it *Iteration, ids *[]TensorID, field string) ([]TensorID, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if r.nRefs+len(raw) > MaxFileRefs {
		return nil, r.errf(field, "%d tensor references in the file, more than the %d allowed", r.nRefs+len(raw), MaxFileRefs)
	}
	r.nRefs += len(raw)
	if cap(*ids)-len(*ids) < len(raw) {
		// A new block: the ops' lists keep the old one, which growing it
		// by append would copy and keep twice.
		*ids = make([]TensorID, 0, max(len(raw), min(2*cap(*ids), 1<<16), 64))
	}
	start := len(*ids)
	for _, v := range raw {
		t, ok := r.tensors[TensorID(v)]
		if !ok {
			return nil, r.errf(field, "tensor %d used before it is declared", v)
		}
		it.Tensors[t.ID] = t
		*ids = append(*ids, t.ID)
	}
	s := (*ids)[start:len(*ids):len(*ids)]
	return s, nil
}

// ReadFile reads a whole trace into memory.
func ReadFile(path string) (*Trace, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return readAll(r)
}

// Read reads a whole trace from an io.Reader; name is used in errors.
func Read(rd io.Reader, name string) (*Trace, error) {
	r, err := NewReader(rd, name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return readAll(r)
}

func readAll(r *Reader) (*Trace, error) {
	tr := &Trace{Name: r.Name(), Header: r.Header()}
	for {
		it, err := r.Next()
		if err == io.EOF {
			return tr, nil
		}
		if err != nil {
			return nil, err
		}
		tr.Iterations = append(tr.Iterations, it)
	}
}
