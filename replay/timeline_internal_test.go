package replay

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

// TestSpansSplitIdleTimeByCause: the clocks line up on the first kernel; a
// gap before a kernel the host queued late is the host's, up to the gap; a
// gap with the kernel long queued is the device's (an event); both can
// share one gap; the launch gap under stallFloor is no stall.
func TestSpansSplitIdleTimeByCause(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	// Host clock: issue times in ns from Begin; the device's clock is
	// 1e9 ahead, plus a 5 us launch latency.
	issued := []int64{0, 10_000, 200_000, 210_000, 600_000}
	st := []Stamp{
		{1e9 + 5_000, 1e9 + 105_000},   // a: 100 us
		{1e9 + 106_000, 1e9 + 150_000}, // b: 1 us after a, queued long before: no stall
		{1e9 + 205_000, 1e9 + 250_000}, // c: issued at 200 (+5): 55 us of host stall
		{1e9 + 300_000, 1e9 + 310_000}, // d: issued at 210, idle 50 us queued: the device's
		{1e9 + 700_000, 1e9 + 710_000}, // e: issued at 600 (+5): 295 us host, 95 us queued
	}
	sp := spans(names, issued, st)
	assert.InDelta(t, 0, sp[0].StartUS, 1e-9)
	assert.InDelta(t, 0, sp[0].IssuedUS, 1e-9)
	assert.Zero(t, sp[1].HostStallUS+sp[1].DeviceStallUS)
	assert.InDelta(t, 55, sp[2].HostStallUS, 1e-9)
	assert.Zero(t, sp[2].DeviceStallUS)
	assert.Zero(t, sp[3].HostStallUS)
	assert.InDelta(t, 50, sp[3].DeviceStallUS, 1e-9)
	assert.InDelta(t, 295, sp[4].HostStallUS, 1e-9)
	assert.InDelta(t, 95, sp[4].DeviceStallUS, 1e-9)
	var ir IterationReport
	stallsOf(&ir, sp, 2)
	assert.InDelta(t, (100+44+45+10+10)/1e3, ir.DeviceBusyMS, 1e-9)
	assert.InDelta(t, (55+295)/1e3, ir.HostStallMS, 1e-9)
	assert.InDelta(t, (50+95)/1e3, ir.DeviceStallMS, 1e-9)
	assert.Equal(t, []Stall{{Op: 4, Name: "e", MS: 0.39, OnHost: true}, {Op: 2, Name: "c", MS: 0.055, OnHost: true}}, ir.WorstStalls)
}

// TestWaitedWithinCountsTheDevicesStalls: of the same spans, a part's wait
// is the device's stalls in it (the host's are not waits for copies), cut
// at the part's edges, less a recompute run in a stall.
func TestWaitedWithinCountsTheDevicesStalls(t *testing.T) {
	sp := []OpSpan{
		{Op: 0, StartUS: 0, EndUS: 100},
		{Op: 1, StartUS: 150, EndUS: 200, DeviceStallUS: 50},
		{Op: 2, StartUS: 300, EndUS: 310, HostStallUS: 60, DeviceStallUS: 40},
		{Op: 3, StartUS: 400, EndUS: 410, HostStallUS: 90},
	}
	// A recompute ran from 110 to 130 us, in op 1's stall; a copy out
	// from 100 to 300 us, which is no compute.
	cp := []CopySpan{{Recompute: true, Op: 0, StartUS: 110, EndUS: 130}, {ToHost: true, Bytes: 1, StartUS: 100, EndUS: 300}}
	assert.InDelta(t, 30+40, waitedWithin(sp, cp, 0, 410), 1e-9)
	assert.InDelta(t, 30, waitedWithin(sp, cp, 0, 150), 1e-9)
	assert.InDelta(t, 20+20, waitedWithin(sp, cp, 120, 280), 1e-9, "cut at both ends")
	assert.Zero(t, waitedWithin(sp, cp, 310, 410), "the host's stall")
	parts := partsOf([]trace.Part{{Name: trace.PartForward, First: 0, Last: 1}, {Name: trace.PartBackward, First: 2, Last: 3}}, sp, cp)
	require.Len(t, parts, 2)
	assert.InDelta(t, 0.03+0.04, parts[0].WaitMS, 1e-12, "op 2's stall ends at its start: in the forward")
	assert.Zero(t, parts[1].WaitMS)
	assert.InDelta(t, 0.3, parts[0].MS, 1e-12)
	assert.InDelta(t, 0.2/0.3, parts[0].D2H, 1e-12)
}

// TestPageAtScale: the host's page at a scale is CUDA's page for the
// full-size limit, divided by the scale.
func TestPageAtScale(t *testing.T) {
	const mib, gib = 1 << 20, 1 << 30
	assert.EqualValues(t, 16*mib/2048, PageAtScale(17*gib/2048, 2048), "16 MiB pages for 17 GiB")
	assert.EqualValues(t, 2*mib/1024, PageAtScale(2*gib/1024, 1024), "2 MiB pages for 2 GiB")
	assert.EqualValues(t, 4*mib/1024, PageAtScale(4*gib/1024, 1024))
	assert.EqualValues(t, 512, PageAtScale(1<<20, 1<<20), "never under a block")
	assert.EqualValues(t, 4096, PageAtScale(2*gib/1000, 1000), "rounded up to a power of two")
}
