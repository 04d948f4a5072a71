package pytorch

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/chameleon-go/chameleon/trace"
	"github.com/chameleon-go/chameleon/trace/internal/jsonio"
)

// Limits of the importer. Input beyond one is refused with a ParseError
// naming the file and, where known, the node or event and the field, so
// that a damaged or hostile file (a small gzip can inflate to gigabytes)
// costs memory in proportion to what the importer keeps of it and is
// refused once a cap is read. They sit far above what real recordings
// reach: the bundled Llama step (llama4-small) has an Execution Trace of
// 2.9 MB (decompressed), 2,829 nodes of at most 14,360 bytes, lists of at
// most 39 elements and 196 distinct names and op schemas (10,770 bytes), and
// a Kineto profile of 2.3 MB with 6,960 events of at most 1,190 bytes;
// no string in either is longer than 870 bytes.
const (
	// MaxInputBytes bounds each file, decompressed (1 GiB). The importer
	// stops reading there, so that a small gzip of blanks or of events it
	// skips cannot keep it busy for minutes.
	MaxInputBytes = 1 << 30
	// MaxValueBytes bounds each JSON value the decoders read at once: an
	// Execution Trace node, a Kineto event, an element of
	// deviceProperties, any other top-level value, which the importer
	// skips (8 MiB, after runs of white space are cut to one byte; 584
	// times the largest real node). A value is refused once that much of
	// it is read, never held whole.
	MaxValueBytes = 8 << 20
	// MaxListLen bounds each list of a node (attrs, the values, shapes,
	// types and strides of inputs and outputs, a list of tensors) and
	// Kineto's deviceProperties.
	MaxListLen = 1 << 16
	// MaxNodes bounds the nodes of an Execution Trace (370 times the
	// bundled step's).
	MaxNodes = 1 << 20
	// MaxTensorArgs bounds the device-tensor arguments of all the nodes of
	// an Execution Trace together (the inputs and outputs the importer
	// keeps).
	MaxTensorArgs = 1 << 21
	// MaxEvents bounds the traceEvents of a Kineto profile, whatever their
	// kind (150 times the bundled step's).
	MaxEvents = 1 << 20
	// MaxStrings and MaxStringBytes bound the distinct strings the importer
	// keeps of each file (node and event names, op schemas, dtypes,
	// devices), each kept once however often it is repeated.
	MaxStrings     = 1 << 16
	MaxStringBytes = 8 << 20

	// MaxEventUS bounds the dur of a Kineto event (a day, in µs:
	// trace.MaxIterMS), and MaxTimestampUS its ts either side of zero
	// (2^53 µs, 285 years: the microseconds a float64 counts exactly;
	// Kineto's clock counts from the epoch or from the trace's start). A
	// negative, absurd or non-finite time is refused, and so is an op whose
	// time (the device time of what it launched, else its host time) is
	// over trace.MaxOpUS (an hour) and a profiled step that spans more than
	// trace.MaxIterMS (a day). The bundled step's longest event takes
	// 81,911 µs; its timestamps are near 5.1e12 µs.
	MaxEventUS     = trace.MaxIterMS * 1000
	MaxTimestampUS = 1 << 53
)

// ParseError is bad input: it names the file, where in it (an Execution
// Trace node id or a Kineto event index, when known) and the field that could
// not be read.
type ParseError struct {
	File  string
	Where string // "node 12", "traceEvents[40]", or empty
	Field string // empty when the value itself is malformed
	Err   error
}

func (e *ParseError) Error() string {
	s := e.File
	if e.Where != "" {
		s += ": " + e.Where
	}
	if e.Field != "" {
		s += fmt.Sprintf(": field %q", e.Field)
	}
	return s + ": " + e.Err.Error()
}

func (e *ParseError) Unwrap() error { return e.Err }

// ErrMismatched is returned (wrapped) when the Kineto profile does not belong
// to the Execution Trace: none of its record-function ids name an ET operator,
// or an id names an operator of another name.
var ErrMismatched = errors.New("kineto profile does not match the execution trace")

// decompress returns r, gunzipped when it starts with the gzip magic bytes.
func decompress(r io.Reader, name string) (io.Reader, func() error, error) {
	size := 1 << 16
	if l, ok := r.(interface{ Len() int }); ok {
		// An in-memory input shorter than the buffer: small ones are read
		// often (tests, fuzzing), and 64 KiB each time is most of their cost.
		size = min(size, max(l.Len(), 16))
	}
	// Plain input is limited as it is read, gzip input once decompressed.
	raw := &jsonio.Limit{R: r, Max: MaxInputBytes, What: "file"}
	br := bufio.NewReaderSize(raw, size)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		raw.Max = math.MaxInt64
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, &ParseError{File: name, Err: fmt.Errorf("gzip: %w", err)}
		}
		return &jsonio.Limit{R: zr, Max: MaxInputBytes, What: "file (decompressed)"}, zr.Close, nil
	}
	return br, func() error { return nil }, nil
}

// decoder is a json.Decoder over a squeezed stream that may read at most
// MaxValueBytes for each token or value it is asked for: a value longer
// than that fails once the cap is read.
type decoder struct {
	*json.Decoder
	r   io.Reader // the squeezed stream, past the values
	win *jsonio.Limit
}

func newDecoder(r io.Reader) *decoder {
	win := &jsonio.Limit{R: newSqueezer(r), Max: MaxValueBytes, What: "value"}
	return &decoder{Decoder: json.NewDecoder(win), r: win, win: win}
}

// from lets the decoder read MaxValueBytes past where it stands.
func (d *decoder) from() { d.win.Start = d.InputOffset() }

func (d *decoder) Token() (json.Token, error) { d.from(); return d.Decoder.Token() }
func (d *decoder) Decode(v any) error         { d.from(); return d.Decoder.Decode(v) }
func (d *decoder) More() bool                 { d.from(); return d.Decoder.More() }

// rest is the stream after the document, with no cap on its length.
func (d *decoder) rest() io.Reader {
	d.win.Max = math.MaxInt64 - d.win.Start
	return io.MultiReader(d.Buffered(), d.r)
}

// interner keeps one copy of each distinct string of a file, within
// MaxStrings and MaxStringBytes.
type interner struct {
	m     map[string]string
	bytes int
}

func (in *interner) get(s string) (string, error) {
	if v, ok := in.m[s]; ok {
		return v, nil
	}
	if in.m == nil {
		in.m = make(map[string]string)
	}
	if len(in.m) >= MaxStrings {
		return "", fmt.Errorf("more than %d distinct strings in the file", MaxStrings)
	}
	if in.bytes+len(s) > MaxStringBytes {
		return "", fmt.Errorf("%d bytes of distinct strings, more than the %d allowed in a file", in.bytes+len(s), MaxStringBytes)
	}
	s = strings.Clone(s) // not a slice of a longer string it would keep
	in.m[s] = s
	in.bytes += len(s)
	return s, nil
}

// listError is a list longer than MaxListLen.
type listError struct{ n int }

func (e *listError) Error() string {
	return fmt.Sprintf("a list of %d elements, more than the %d allowed", e.n, MaxListLen)
}

// rawList is a JSON list of at most MaxListLen values, counted before any
// is decoded: left to encoding/json, a megabyte list of zeros costs some
// fifty times its size.
type rawList []json.RawMessage

func (l *rawList) UnmarshalJSON(b []byte) error { return decodeList(b, (*[]json.RawMessage)(l)) }

// attrList is a node's attrs, at most MaxListLen of them.
type attrList []rawAttr

func (l *attrList) UnmarshalJSON(b []byte) error { return decodeList(b, (*[]rawAttr)(l)) }

func decodeList[T any](b []byte, dst *[]T) error {
	if len(b) == 0 || b[0] != '[' {
		return json.Unmarshal(b, dst) // null, or a type error worded by encoding/json
	}
	n := jsonio.CountElements(b)
	if n > MaxListLen {
		return &listError{n: n}
	}
	s := make([]T, 0, n)
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*dst = s
	return nil
}

// checkTime says why x, a time in µs, is not a number in [0, hi], nil
// when it is; what says what hi is ("a day").
func checkTime(x, hi float64, what string) error {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return fmt.Errorf("%g: not a finite number", x)
	case x < 0:
		return fmt.Errorf("negative: %g µs", x)
	case x > hi:
		return fmt.Errorf("%g µs, more than %s (%g µs)", x, what, hi)
	}
	return nil
}

// clip shortens a string quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// readErr wraps an error of the JSON decoder or the stream under it.
func readErr(name, where string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("file ends early (truncated?): %w", io.ErrUnexpectedEOF)
	}
	return &ParseError{File: name, Where: where, Err: err}
}
