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
	"strings"

	"github.com/chameleon-go/chameleon/trace/internal/jsonio"
)

// FormatKernels is the format string of a kernel-times file.
const FormatKernels = "optrace-kernels/v1"

// Limits of the kernel-times reader. The reader streams the document one op
// at a time, runs of blanks cut to one byte, and refuses input beyond a
// limit with a ParseError once the limit is read, so that a small gzip file
// that inflates to gigabytes costs a few megabytes, and no single value
// (an op, a string) more than a few times MaxKernelsBytes. The real files
// (Llama, LoRA, Mixtral, GPT-2, Qwen2 recorded on an H200) are single-line
// documents of at most 401,369 bytes and 5,594 ops.
const (
	// MaxKernelsBytes bounds the size of a kernel-times file, decompressed
	// (8 MiB, 20 times the largest real one).
	MaxKernelsBytes = 8 << 20
	// MaxKernelOps bounds its ops (46 times the largest real count).
	MaxKernelOps = 1 << 18
)

// Kernels holds each op's GPU kernel time for one iteration, measured by a
// profiler without syncs between ops: on a GPU-bound run it is the real
// timeline, where the per-op durations of an optrace carry a sync floor.
type Kernels struct {
	Model         string
	SeqLen        int
	IterationMS   float64
	KernelMSTotal float64
	Ops           []KernelOp
}

// KernelOp is one op's kernel time.
type KernelOp struct {
	Seq      int     `json:"seq"`
	Name     string  `json:"name"`
	Overload string  `json:"overload"`
	KernelUS float64 `json:"kernel_us"`
}

// ReadKernelsFile reads an optrace-kernels/v1 file, gzip or plain.
func ReadKernelsFile(path string) (*Kernels, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadKernels(f, filepath.Base(path))
}

// ReadKernels reads an optrace-kernels/v1 document from r, gzip-compressed
// or plain (told by its first bytes). It refuses a document beyond
// MaxKernelsBytes or MaxKernelOps, a time outside [0, MaxIterMS] ms
// (iteration_ms, kernel_ms_total) or [0, MaxOpUS] µs (kernel_us), and a
// document cut short (a truncated gzip included); errors are ParseErrors
// naming the line (where the decoder stood: the document is usually one
// line) and the field, ops[i].seq for instance.
func ReadKernels(r io.Reader, name string) (*Kernels, error) {
	size := 1 << 16
	if l, ok := r.(interface{ Len() int }); ok {
		size = min(size, max(l.Len(), 16)) // see newReader
	}
	// Plain input is limited as it is read, gzip input once decompressed.
	raw := &jsonio.Limit{R: r, Max: MaxKernelsBytes}
	br := bufio.NewReaderSize(raw, size)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		raw.Max = math.MaxInt64
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, &ParseError{File: name, Line: 0, Err: fmt.Errorf("gzip: %w", err)}
		}
		defer zr.Close()
		src = &jsonio.Limit{R: zr, Max: MaxKernelsBytes}
	}
	kr := &kernelsReader{name: name, lines: &lineCounter{r: &jsonio.Blanks{R: src}}, strs: make(map[string]string)}
	kr.dec = json.NewDecoder(kr.lines)
	return kr.read()
}

// lineCounter counts the newlines read through it.
type lineCounter struct {
	r io.Reader
	n int
}

func (c *lineCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += bytes.Count(p[:n], []byte{'\n'})
	return n, err
}

type kernelsReader struct {
	name  string
	dec   *json.Decoder
	lines *lineCounter
	strs  map[string]string
}

// line is the line (from 1) where the decoder stands: the newlines read
// less those it holds unread.
func (k *kernelsReader) line() int {
	rest, _ := io.ReadAll(k.dec.Buffered())
	return k.lines.n - bytes.Count(rest, []byte{'\n'}) + 1
}

func (k *kernelsReader) errf(field, format string, args ...any) error {
	return &ParseError{File: k.name, Line: k.line(), Field: field, Err: fmt.Errorf(format, args...)}
}

// readErr wraps an error of the decoder or the stream under it.
func (k *kernelsReader) readErr(field string, err error) error {
	var te *json.UnmarshalTypeError
	var tl *jsonio.TooLargeError
	switch {
	case errors.As(err, &te):
		f := field
		if te.Field != "" {
			f += "." + te.Field
		}
		err = fmt.Errorf("want %s, got JSON %s", te.Type, te.Value)
		field = strings.TrimPrefix(f, ".")
	case errors.As(err, &tl):
		err = fmt.Errorf("document longer than %d bytes (decompressed)", MaxKernelsBytes)
	case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("document ends early (truncated?): %w", io.ErrUnexpectedEOF)
	}
	return &ParseError{File: k.name, Line: k.line(), Field: field, Err: err}
}

func (k *kernelsReader) intern(s string) string {
	if v, ok := k.strs[s]; ok {
		return v
	}
	k.strs[s] = s
	return s
}

func (k *kernelsReader) read() (*Kernels, error) {
	dec := k.dec
	tok, err := dec.Token()
	if err != nil {
		return nil, k.readErr("", err)
	}
	if tok != json.Delim('{') {
		return nil, k.errf("", "want a JSON object, got %v", tok)
	}
	var format string
	out := &Kernels{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, k.readErr("", err)
		}
		key, _ := tok.(string)
		// Keys match as encoding/json matches them, case aside.
		switch {
		case strings.EqualFold(key, "format"):
			format = ""
			if err := dec.Decode(&format); err != nil {
				return nil, k.readErr("format", err)
			}
			if format != FormatKernels {
				return nil, k.errf("format", "unsupported format %q", clip(format))
			}
		case strings.EqualFold(key, "model"):
			if err := dec.Decode(&out.Model); err != nil {
				return nil, k.readErr("model", err)
			}
		case strings.EqualFold(key, "seq_len"):
			if err := dec.Decode(&out.SeqLen); err != nil {
				return nil, k.readErr("seq_len", err)
			}
		case strings.EqualFold(key, "iteration_ms"):
			if err := k.decodeMS("iteration_ms", &out.IterationMS); err != nil {
				return nil, err
			}
		case strings.EqualFold(key, "kernel_ms_total"):
			if err := k.decodeMS("kernel_ms_total", &out.KernelMSTotal); err != nil {
				return nil, err
			}
		case strings.EqualFold(key, "ops"):
			if out.Ops, err = k.ops(); err != nil {
				return nil, err
			}
		default:
			if err := k.skip(key); err != nil {
				return nil, err
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, k.readErr("", err)
	}
	// Only white space may follow; reading to the end checks the gzip
	// stream's length and checksum.
	if tok, err := dec.Token(); err != io.EOF {
		if err != nil {
			return nil, k.readErr("", err)
		}
		return nil, k.errf("", "data after the end of the document (%v)", tok)
	}
	if format != FormatKernels {
		return nil, k.errf("format", "unsupported format %q", clip(format))
	}
	return out, nil
}

// decodeMS reads an iteration's time in milliseconds into v, within
// [0, MaxIterMS].
func (k *kernelsReader) decodeMS(field string, v *float64) error {
	if err := k.dec.Decode(v); err != nil {
		return k.readErr(field, err)
	}
	if err := checkRange(*v, MaxIterMS, "ms", "a day"); err != nil {
		return &ParseError{File: k.name, Line: k.line(), Field: field, Err: err}
	}
	return nil
}

// ops reads the ops list one op at a time, checking each as it comes.
func (k *kernelsReader) ops() ([]KernelOp, error) {
	dec := k.dec
	tok, err := dec.Token()
	if err != nil {
		return nil, k.readErr("ops", err)
	}
	if tok == nil {
		return nil, nil // null
	}
	if tok != json.Delim('[') {
		return nil, k.errf("ops", "want a list, got %v", tok)
	}
	var ops []KernelOp
	for i := 0; dec.More(); i++ {
		if i >= MaxKernelOps {
			return nil, k.errf("ops", "more than %d ops", MaxKernelOps)
		}
		field := fmt.Sprintf("ops[%d]", i)
		var op KernelOp
		if err := dec.Decode(&op); err != nil {
			return nil, k.readErr(field, err)
		}
		if op.Seq != i {
			return nil, k.errf(field+".seq", "got %d", op.Seq)
		}
		if err := checkRange(op.KernelUS, MaxOpUS, "µs", "an hour"); err != nil {
			return nil, &ParseError{File: k.name, Line: k.line(), Field: field + ".kernel_us", Err: err}
		}
		op.Name, op.Overload = k.intern(op.Name), k.intern(op.Overload)
		ops = append(ops, op)
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return nil, k.readErr("ops", err)
	}
	return ops, nil
}

// skip reads past one value of an unknown key a token at a time.
func (k *kernelsReader) skip(key string) error {
	depth := 0
	for {
		tok, err := k.dec.Token()
		if err != nil {
			return k.readErr(clip(key), err)
		}
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
	}
}
