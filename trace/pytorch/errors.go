package pytorch

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
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
	br := bufio.NewReaderSize(r, size)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, &ParseError{File: name, Err: fmt.Errorf("gzip: %w", err)}
		}
		return zr, zr.Close, nil
	}
	return br, func() error { return nil }, nil
}

// readErr wraps an error of the JSON decoder or the stream under it.
func readErr(name, where string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("file ends early (truncated?): %w", io.ErrUnexpectedEOF)
	}
	return &ParseError{File: name, Where: where, Err: err}
}
