package device

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomLives makes n blocks of sizes in multiples of align with random
// lives on a clock of t, a tenth of them living across the end.
func randomLives(r *rand.Rand, n int, t int32, align int64) []placeItem {
	items := make([]placeItem, n)
	for i := range items {
		size := align * (1 + r.Int64N(64))
		if r.IntN(20) == 0 {
			size *= 32
		}
		from := r.Int32N(t)
		to := from + 1 + r.Int32N(t/4)
		l := life{n: 1, iv: [2]span{{from, min(to, t)}}}
		if to > t {
			l = life{n: 2, iv: [2]span{{from, t}, {0, to - t}}}
		}
		items[i] = placeItem{size: size, life: l}
	}
	return items
}

// peakLive is the most bytes whose lives meet at one point of the clock.
func peakLive(items []placeItem, fixed []placed, t int32) int64 {
	var peak int64
	for c := range t {
		at := life{n: 1, iv: [2]span{{c, c + 1}}}
		var sum int64
		for _, it := range items {
			if it.life.meets(at) {
				sum += it.size
			}
		}
		for _, f := range fixed {
			if f.life.meets(at) {
				sum += f.size
			}
		}
		peak = max(peak, sum)
	}
	return peak
}

// TestPackBlocks checks random packings: no two blocks whose lives meet
// share a byte, none leaves its range or lands on a fixed block, and the
// packing spans little more than the most bytes ever live at once.
func TestPackBlocks(t *testing.T) {
	const align = 512
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		const clock = 400
		items := randomLives(r, 300, clock, align)
		base := uintptr(1 << 30)
		whole := life{n: 1, iv: [2]span{{0, clock}}}
		fixed := []placed{{addr: base + 64*align, size: 100 * align, life: whole}}
		segs := []placed{{addr: base, size: 1 << 30}}
		addrs := packBlocks(segs, fixed, items, 0)
		var top uintptr
		for i, it := range items {
			a := addrs[i]
			require.NotZero(t, a, "seed %d: item %d unplaced", seed, i)
			require.GreaterOrEqual(t, a, base)
			require.LessOrEqual(t, a+uintptr(it.size), base+1<<30)
			require.Zero(t, a%align)
			top = max(top, a+uintptr(it.size))
			for _, f := range fixed {
				require.False(t, a < f.addr+uintptr(f.size) && f.addr < a+uintptr(it.size), "seed %d: item %d on a fixed block", seed, i)
			}
			for j := range i {
				b, jt := addrs[j], items[j]
				if it.life.meets(jt.life) {
					require.False(t, a < b+uintptr(jt.size) && b < a+uintptr(it.size),
						"seed %d: items %d and %d overlap while both live", seed, i, j)
				}
			}
		}
		peak := peakLive(items, fixed, clock)
		span := int64(top - base)
		t.Logf("seed %d: span/peak %.3f", seed, float64(span)/float64(peak))
		assert.LessOrEqual(t, span, peak*12/10, "seed %d: packing spans %d bytes for a peak of %d", seed, span, peak)
	}
}

// TestPackBlocksNoRoom: a block larger than every gap stays unplaced, and
// the rest still go.
func TestPackBlocksNoRoom(t *testing.T) {
	whole := life{n: 1, iv: [2]span{{0, 10}}}
	segs := []placed{{addr: 4096, size: 4096}}
	items := []placeItem{{size: 8192, life: whole}, {size: 1024, life: whole}, {size: 1024, life: life{n: 1, iv: [2]span{{2, 3}}}}}
	addrs := packBlocks(segs, nil, items, 0)
	assert.Zero(t, addrs[0])
	assert.Equal(t, uintptr(4096), addrs[1])
	assert.Equal(t, uintptr(4096+1024), addrs[2])
}

// BenchmarkPackBlocks packs a training step's worth of blocks: 2,000 of
// 2 MiB pages' worth of sizes, half saved in the forward and freed in the
// backward in reverse order (nested lives), half short-lived, in a
// 32 GiB range of 2 MiB pages. The allocator packs once per plan, at an
// iteration boundary, on the host's critical path.
func BenchmarkPackBlocks(b *testing.B) {
	const n, page = 2000, 2 << 20
	r := rand.New(rand.NewPCG(1, 2))
	clock := int32(4 * n)
	items := make([]placeItem, n)
	for i := range items {
		size := int64(1+r.IntN(64)) << 16
		if r.IntN(10) == 0 {
			size = int64(1+r.IntN(48)) << 20
		}
		from := int32(2 * i)
		to := clock - from
		if i%2 == 1 {
			to = from + 1 + r.Int32N(64)
		}
		items[i] = placeItem{size: size, life: life{n: 1, iv: [2]span{{from, to}}}}
	}
	segs := []placed{{addr: 1 << 40, size: 32 << 30}}
	b.ReportAllocs()
	for b.Loop() {
		packBlocks(segs, nil, items, page)
	}
}
