package cuda

import "testing"

// FakeVMM is what the external tests read of the fake's mapping state.
type FakeVMM struct {
	Creates, LiveHandles, Reservations, NetPushes func() int64
}

// NewMappedFake is newMappedFake for the external tests.
func NewMappedFake(t testing.TB) (*Device, FakeVMM) {
	d, ctl := newMappedFake(t)
	return d, FakeVMM{
		Creates:      func() int64 { return ctl.vmmCount(vmmCreates) },
		LiveHandles:  ctl.liveHandles,
		Reservations: ctl.reservations,
		NetPushes:    ctl.netPushes,
	}
}
