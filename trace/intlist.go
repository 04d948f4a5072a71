package trace

import (
	"encoding/json"
	"math"

	"github.com/chameleon-go/chameleon/trace/internal/jsonio"
)

// The integer lists of an optrace line decode with their length checked
// before anything is allocated: left to encoding/json, a line of ten million
// dims costs some 25 times its size while the slice grows.
type (
	dimList []int64 // a tensor's shape, at most MaxShapeDims
	inList  []int64 // an op's inputs, at most MaxOpTensors
	outList []int64 // an op's outputs, at most MaxOpTensors
	// floatList is the footer's iteration times, at most MaxFileIterations.
	floatList []float64
)

func (l *dimList) UnmarshalJSON(b []byte) error {
	return decodeInts(b, MaxShapeDims, "shape", (*[]int64)(l))
}

func (l *inList) UnmarshalJSON(b []byte) error {
	return decodeInts(b, MaxOpTensors, "in", (*[]int64)(l))
}

func (l *outList) UnmarshalJSON(b []byte) error {
	return decodeInts(b, MaxOpTensors, "out", (*[]int64)(l))
}

func (l *floatList) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '[' {
		return json.Unmarshal(b, (*[]float64)(l))
	}
	n := jsonio.CountElements(b)
	if n > MaxFileIterations {
		return &listError{field: "uninstrumented_iter_ms", n: n, max: MaxFileIterations}
	}
	s := make([]float64, 0, n)
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*l = s
	return nil
}

// listError is a list longer than its limit.
type listError struct {
	field  string
	n, max int
}

func (e *listError) Error() string { return e.field + ": list too long" }

// decodeInts decodes b, one valid JSON value, into dst as encoding/json
// would, refusing a list of more than limit elements.
func decodeInts(b []byte, limit int, field string, dst *[]int64) error {
	if len(b) == 0 || b[0] != '[' {
		return json.Unmarshal(b, dst) // null, or a type error worded by encoding/json
	}
	n := jsonio.CountElements(b)
	if n > limit {
		return &listError{field: field, n: n, max: limit}
	}
	s := (*dst)[:0] // the caller's array when it has room
	if s == nil || cap(s) < n {
		s = make([]int64, 0, n)
	}
	s, ok := parseInts(b, s)
	if !ok {
		// Something other than plain integers: encoding/json decides, into
		// a slice that already has room for every element.
		s = s[:0]
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	*dst = s
	return nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// parseInts appends the elements of the valid JSON array b to s when they
// are all integers int64 holds; ok is false otherwise.
func parseInts(b []byte, s []int64) (_ []int64, ok bool) {
	i := 1
	for {
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i < len(b) && b[i] == ']' && len(s) == 0 {
			return s, true
		}
		neg := i < len(b) && b[i] == '-'
		if neg {
			i++
		}
		start := i
		var u uint64
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			u = u*10 + uint64(b[i]-'0')
			i++
		}
		// 19 digits cannot overflow a uint64.
		if i == start || i-start > 19 || u > math.MaxInt64+uint64(b2u(neg)) {
			return s, false
		}
		v := int64(u)
		if neg {
			v = -v
		}
		s = append(s, v)
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i >= len(b) {
			return s, false
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return s, true
		default: // a fraction or an exponent
			return s, false
		}
	}
}

func b2u(b bool) int {
	if b {
		return 1
	}
	return 0
}
