package jsonio

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chunked returns at most n bytes per Read.
type chunked struct {
	r io.Reader
	n int
}

func (c *chunked) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

func TestLimit(t *testing.T) {
	for _, chunk := range []int{1, 3, 1 << 10} {
		// At the cap: all of it, then EOF.
		got, err := io.ReadAll(&Limit{R: &chunked{strings.NewReader("abcdef"), chunk}, Max: 6})
		require.NoError(t, err)
		assert.Equal(t, "abcdef", string(got))
		// One byte over: the cap's worth, then the error.
		l := &Limit{R: &chunked{strings.NewReader("abcdefg"), chunk}, Max: 6, What: "file"}
		got, err = io.ReadAll(l)
		var tl *TooLargeError
		require.ErrorAs(t, err, &tl)
		assert.Equal(t, "abcdef", string(got))
		assert.Equal(t, "file longer than 6 bytes", err.Error())
		assert.Equal(t, int64(6), l.N)
	}
	// A moving window: Max bytes past each Start.
	l := &Limit{R: strings.NewReader("abcdefgh"), Max: 3}
	buf := make([]byte, 8)
	n, err := l.Read(buf)
	assert.Equal(t, 3, n)
	require.NoError(t, err)
	_, err = l.Read(buf)
	require.Error(t, err)
	assert.Equal(t, "input longer than 3 bytes", err.Error())
	l = &Limit{R: strings.NewReader("abcdefgh"), Max: 3}
	_, _ = l.Read(buf[:2])
	l.Start = 2
	n, _ = l.Read(buf)
	assert.Equal(t, "cde", string(buf[:n]))
	// No cap past MaxInt64 overflows.
	l = &Limit{R: strings.NewReader("ab"), Max: 1 << 62, Start: 1 << 62}
	got, err := io.ReadAll(l)
	require.NoError(t, err)
	assert.Equal(t, "ab", string(got))
}

func TestBlanks(t *testing.T) {
	tests := []struct{ give, want string }{
		{`{"a": 1}`, `{"a": 1}`},
		{"{   \"a\" :\t\t [1,  \r 2]  }   ", "{ \"a\" :\t[1, 2] } "},
		{"{\n\n \"a\":\n  1 \n}\n\n", "{\n\n \"a\":\n 1 \n}\n\n"},
		{`{"a   b": "x \" \\  y"}`, `{"a   b": "x \" \\  y"}`},
		{`"\\"   ""`, `"\\" ""`},
		{"   ", " "},
		{"", ""},
	}
	for _, tt := range tests {
		for _, chunk := range []int{1, 2, 3, 1 << 10} {
			got, err := io.ReadAll(&Blanks{R: &chunked{strings.NewReader(tt.give), chunk}})
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got), "%q in chunks of %d", tt.give, chunk)
		}
	}
	// Each read fills the buffer while there is input.
	b := &Blanks{R: &chunked{strings.NewReader("a" + strings.Repeat("  \n", 100)), 2}}
	p := make([]byte, 50)
	n, err := b.Read(p)
	require.NoError(t, err)
	assert.Equal(t, 50, n)
	// An error after some bytes comes with them.
	b = &Blanks{R: io.MultiReader(strings.NewReader("ab  "), iotest{})}
	n, err = b.Read(make([]byte, 10))
	assert.Equal(t, 3, n)
	assert.ErrorIs(t, err, errBroken)
}

var errBroken = errors.New("broken")

type iotest struct{}

func (iotest) Read([]byte) (int, error) { return 0, errBroken }

func TestCountElements(t *testing.T) {
	tests := []string{
		`[]`, `[ ]`, `[1]`, `[1,2,3]`, `[ 1 , 2 ]`, `[[1,2],[3]]`, `[{"a":1,"b":[2,3]},4]`,
		`["a,b","c\"d,",",",[","]]`, `[null,true,false,"",{}]`,
	}
	for _, give := range tests {
		var v []json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(give), &v), give)
		assert.Equal(t, len(v), CountElements([]byte(give)), give)
	}
}
