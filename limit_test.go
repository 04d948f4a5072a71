package chameleon_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
)

func TestParseLimit(t *testing.T) {
	tests := []struct {
		give string
		want int64
		err  bool
	}{
		{"70%", 700, false},
		{"12GiB", 12 << 30, false},
		{"12GB", 12e9, false},
		{"1e3", 1000, false},
		{"512 MiB", 512 << 20, false},
		{"x%", 0, true},
		{"-1", 0, true},
		{"0%", 0, true},
	}
	for _, tt := range tests {
		got, err := chameleon.ParseLimit(tt.give, 1000)
		if tt.err {
			assert.Error(t, err, tt.give)
			continue
		}
		require.NoError(t, err, tt.give)
		assert.Equal(t, tt.want, got, tt.give)
	}
}

// FuzzParseLimit: any text gives an error or a non-negative limit.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"70%", "12GiB", "1e3", "x", "-1%", "NaN", "1e400GB", "0.5 %"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := chameleon.ParseLimit(s, 1<<40)
		if err == nil && v < 0 {
			t.Fatalf("%q: negative limit %d", s, v)
		}
	})
}

func TestParseTiers(t *testing.T) {
	tests := []struct {
		give string
		want []int
	}{
		{"90,95,100", []int{90, 95, 100}},
		{"90%, 100%", []int{90, 100}},
		{"100", []int{100}},
		{"", nil},
		{"x", nil},
		{"0,100", nil},
		{"101", nil},
		{"95,90", nil},
		{"90,90", nil},
		{"90,,100", nil},
	}
	for _, tt := range tests {
		got, err := chameleon.ParseTiers(tt.give)
		if tt.want == nil {
			assert.Error(t, err, tt.give)
			continue
		}
		require.NoError(t, err, tt.give)
		assert.Equal(t, tt.want, got, tt.give)
	}
}

// FuzzParseTiers: any text gives an error or tiers WithTiers accepts.
func FuzzParseTiers(f *testing.F) {
	for _, s := range []string{"90,95,100", "100", "90%, 100%", "x", "95,90", "0", "1,2,3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := chameleon.ParseTiers(s)
		if err != nil {
			return
		}
		require.NotEmpty(t, got, "%q", s)
		for i, v := range got {
			if v < 1 || v > 100 || (i > 0 && v <= got[i-1]) {
				t.Fatalf("%q: tiers %v", s, got)
			}
		}
	})
}
