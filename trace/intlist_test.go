package trace

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeInts decodes what encoding/json decodes, to the same values, and
// refuses what it refuses.
func TestDecodeIntsAgreesWithEncodingJSON(t *testing.T) {
	tests := []string{
		`[]`, ` [ ] `, `[1]`, `[1, -2 ,3]`, "[\n4,\t5\r]", `[0, -0]`,
		`[9223372036854775807]`, `[-9223372036854775808]`,
		`[9223372036854775808]`, `[-9223372036854775809]`, `[18446744073709551616]`,
		`[1.5]`, `[1e2]`, `[1E2]`, `[null]`, `[1, null]`, `["a"]`, `[true]`, `[[1]]`, `[{"a":[1,2]}]`,
		`null`, `5`, `"5"`, `{}`, `[1,"a,b",[2,3]]`,
	}
	for _, give := range tests {
		t.Run(give, func(t *testing.T) {
			var want []int64
			wantErr := json.Unmarshal([]byte(give), &want)
			var got []int64
			err := decodeInts([]byte(give), 100, "f", &got)
			if wantErr != nil {
				require.Error(t, err)
				assert.Equal(t, wantErr.Error(), err.Error())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

func TestDecodeIntsCountsBeforeDecoding(t *testing.T) {
	tests := []struct {
		give    string
		limit   int
		wantErr bool
	}{
		{give: `[]`, limit: 0},
		{give: `[1,2,3]`, limit: 3},
		{give: `[1,2,3]`, limit: 2, wantErr: true},
		{give: `[1,"a,b",[2,3],{"x":1,"y":2}]`, limit: 3, wantErr: true}, // 4 elements
		{give: `["\"", 1]`, limit: 1, wantErr: true},
	}
	for _, tt := range tests {
		var got []int64
		err := decodeInts([]byte(tt.give), tt.limit, "in", &got)
		var le *listError
		if tt.wantErr {
			require.ErrorAs(t, err, &le, tt.give)
			assert.Equal(t, "in", le.field)
			assert.Equal(t, tt.limit, le.max)
			continue
		}
		assert.NoError(t, err, tt.give)
	}
}

// FuzzDecodeInts: on any valid JSON value, decodeInts and encoding/json
// agree (with a limit no input reaches).
func FuzzDecodeInts(f *testing.F) {
	for _, s := range []string{`[1,-2,3]`, `[9223372036854775808]`, `[1.5]`, `[null,"x"]`, `null`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		var want, got []int64
		wantErr := json.Unmarshal(b, &want)
		err := decodeInts(trimSpace(b), len(b)+1, "f", &got)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: decodeInts %v, encoding/json %v", b, err, wantErr)
		}
		if err == nil && !equalInts(got, want) {
			t.Fatalf("%q: got %v, want %v", b, got, want)
		}
	})
}

// trimSpace is what encoding/json does before handing a value to
// UnmarshalJSON.
func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
