// Package jsonio holds the bounded-input helpers the trace readers share: a
// reader that fails past a size instead of growing without end, a reader
// that cuts runs of blanks before a json.Decoder sees them, and a count of a
// JSON list's elements taken before anything is allocated for them.
package jsonio

import (
	"fmt"
	"io"
	"math"
)

// TooLargeError is what a Limit returns once its input holds more than Max
// bytes.
type TooLargeError struct {
	Max  int64
	What string // what was measured, "input" when empty
}

func (e *TooLargeError) Error() string {
	what := e.What
	if what == "" {
		what = "input"
	}
	return fmt.Sprintf("%s longer than %d bytes", what, e.Max)
}

// Limit passes the first Max bytes of R through and then fails with a
// *TooLargeError if R holds more: unlike io.LimitReader, input past the
// cap is an error, never a silently shorter document. Start may be moved
// forward between reads to bound each value a decoder reads separately:
// the bytes passed may then reach Start+Max.
type Limit struct {
	R     io.Reader
	Max   int64  // bytes that may be passed after Start
	Start int64  // where the count of Max starts, 0 for the first byte
	N     int64  // bytes passed so far
	What  string // names the limit in the error
}

func (l *Limit) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	end := l.Start + l.Max
	if l.Max > math.MaxInt64-l.Start {
		end = math.MaxInt64
	}
	if l.N >= end {
		// At the cap: one more byte, if there is one, is an error.
		var b [1]byte
		for range 100 {
			n, err := l.R.Read(b[:])
			if n > 0 {
				return 0, &TooLargeError{Max: l.Max, What: l.What}
			}
			if err != nil {
				return 0, err
			}
		}
		return 0, io.ErrNoProgress
	}
	if rem := end - l.N; int64(len(p)) > rem {
		p = p[:rem]
	}
	n, err := l.R.Read(p)
	l.N += int64(n)
	return n, err
}

// Blanks passes a JSON stream through with every run of spaces, tabs and
// carriage returns outside strings cut to its first byte; newlines all pass,
// so the line of each byte is what it was. Each Read fills p unless the
// input ends or fails. A json.Decoder keeps the white space it skips between
// tokens in its buffer and scans it again on each refill: megabytes of blanks
// would cost memory and time quadratic in their length, and newlines, which
// stay, cost a scan per doubling of the buffer at most since reads fill it.
type Blanks struct {
	R     io.Reader
	inStr bool // inside a string
	esc   bool // after a backslash inside a string
	blank bool // the last byte passed on was a blank outside a string
}

func (s *Blanks) Read(p []byte) (int, error) {
	w, idle := 0, 0
	for w < len(p) {
		n, err := s.R.Read(p[w:])
		if n == 0 && err == nil {
			if idle++; idle == 100 {
				return w, io.ErrNoProgress
			}
			continue
		}
		for _, c := range p[w : w+n] {
			switch {
			case s.inStr:
				switch {
				case s.esc:
					s.esc = false
				case c == '\\':
					s.esc = true
				case c == '"':
					s.inStr = false
				}
			case c == ' ' || c == '\t' || c == '\r':
				if s.blank {
					continue
				}
				s.blank = true
				p[w] = c
				w++
				continue
			case c == '"':
				s.inStr = true
			}
			s.blank = false
			p[w] = c
			w++
		}
		if err != nil {
			return w, err
		}
	}
	return w, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// CountElements counts the elements of b, a valid JSON array (as
// encoding/json hands it to an UnmarshalJSON method: no white space around
// it), without decoding them.
func CountElements(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	n, depth, inStr, esc, empty := 1, 0, false, false, true
	for _, c := range b[1 : len(b)-1] {
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
		case c == '[' || c == '{':
			depth++
		case c == ']' || c == '}':
			depth--
		case c == ',' && depth == 0:
			n++
		}
		if !isSpace(c) {
			empty = false
		}
	}
	if empty {
		return 0
	}
	return n
}
