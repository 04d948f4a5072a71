package place

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// randomLives makes n blocks of sizes in multiples of align with random
// lives on a clock of t, a tenth of them living across the end.
func randomLives(r *rand.Rand, n int, t int32, align int64) []Item {
	items := make([]Item, n)
	for i := range items {
		size := align * (1 + r.Int64N(64))
		if r.IntN(20) == 0 {
			size *= 32
		}
		from := r.Int32N(t)
		to := from + 1 + r.Int32N(t/4)
		l := Life{N: 1, IV: [2]Span{{from, min(to, t)}}}
		if to > t {
			l = Life{N: 2, IV: [2]Span{{from, t}, {0, to - t}}}
		}
		items[i] = Item{Size: size, Life: l}
	}
	return items
}

// peakLive is the most bytes whose lives meet at one point of the clock.
func peakLive(items []Item, fixed []Placed, t int32) int64 {
	var peak int64
	for c := range t {
		at := Life{N: 1, IV: [2]Span{{c, c + 1}}}
		var sum int64
		for _, it := range items {
			if it.Life.Meets(at) {
				sum += it.Size
			}
		}
		for _, f := range fixed {
			if f.Life.Meets(at) {
				sum += f.Size
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
		whole := Life{N: 1, IV: [2]Span{{From: 0, To: clock}}}
		fixed := []Placed{{Addr: base + 64*align, Size: 100 * align, Life: whole}}
		segs := []Placed{{Addr: base, Size: 1 << 30}}
		addrs := Pack(segs, fixed, items, 0)
		var top uintptr
		for i, it := range items {
			a := addrs[i]
			require.NotZero(t, a, "seed %d: item %d unplaced", seed, i)
			require.GreaterOrEqual(t, a, base)
			require.LessOrEqual(t, a+uintptr(it.Size), base+1<<30)
			require.Zero(t, a%align)
			top = max(top, a+uintptr(it.Size))
			for _, f := range fixed {
				require.False(t, a < f.Addr+uintptr(f.Size) && f.Addr < a+uintptr(it.Size), "seed %d: item %d on a fixed block", seed, i)
			}
			for j := range i {
				b, jt := addrs[j], items[j]
				if it.Life.Meets(jt.Life) {
					require.False(t, a < b+uintptr(jt.Size) && b < a+uintptr(it.Size),
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
	whole := Life{N: 1, IV: [2]Span{{From: 0, To: 10}}}
	segs := []Placed{{Addr: 4096, Size: 4096}}
	items := []Item{{Size: 8192, Life: whole}, {Size: 1024, Life: whole}, {Size: 1024, Life: Life{N: 1, IV: [2]Span{{From: 2, To: 3}}}}}
	addrs := Pack(segs, nil, items, 0)
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
	items := make([]Item, n)
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
		items[i] = Item{Size: size, Life: Life{N: 1, IV: [2]Span{{From: from, To: to}}}}
	}
	segs := []Placed{{Addr: 1 << 40, Size: 32 << 30}}
	b.ReportAllocs()
	for b.Loop() {
		Pack(segs, nil, items, page)
	}
}

// TestPackKeepsTheBestOrder: without pages Pack packs by bytes and by
// bytes over the life's hull and keeps the lower reach, so it never
// reaches higher than the order by bytes alone, and on some random steps
// lower.
func TestPackKeepsTheBestOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	reach := func(items []Item, addrs []uintptr, base uintptr) int64 {
		var top int64
		for i, a := range addrs {
			require.NotZero(t, a)
			top = max(top, int64(a-base)+items[i].Size)
		}
		return top
	}
	lower := 0
	for range 200 {
		items := randomLives(r, 40, 100, 512)
		const base = 1 << 20
		segs := []Placed{{Addr: base, Size: 1 << 30}}
		bySize := make([]int, len(items))
		for i := range bySize {
			bySize[i] = i
		}
		slices.SortStableFunc(bySize, func(x, y int) int {
			return cmp.Or(cmp.Compare(items[y].Size, items[x].Size), cmp.Compare(items[x].Life.IV[0].From, items[y].Life.IV[0].From))
		})
		best := reach(items, Pack(segs, nil, items, 0), base)
		one := reach(items, PackOrder(segs, nil, items, 0, bySize), base)
		require.LessOrEqual(t, best, one)
		if best < one {
			lower++
		}
	}
	assert.Positive(t, lower, "the order by bytes over the life's hull packs some step lower")
}
