package ascend

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/internal/dl"
)

// aclrtEventRecordedStatus values (acl_rt.h).
const (
	eventRecordedNotReady = 0 // ACL_EVENT_RECORDED_STATUS_NOT_READY
	eventRecordedComplete = 1 // ACL_EVENT_RECORDED_STATUS_COMPLETE
)

type eventFuncs struct {
	// aclError aclrtCreateEvent(aclrtEvent *event);
	aclrtCreateEvent func(event *uintptr) int32
	// aclError aclrtDestroyEvent(aclrtEvent event);
	aclrtDestroyEvent func(event uintptr) int32
	// aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
	aclrtRecordEvent func(event, stream uintptr) int32
	// aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status);
	aclrtQueryEventStatus func(event uintptr, status *int32) int32
	// aclError aclrtSynchronizeEvent(aclrtEvent event);
	aclrtSynchronizeEvent func(event uintptr) int32

	// Optional: event timing (NewTimingEvent, Elapsed).
	// aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag);
	aclrtCreateEventWithFlag func(event *uintptr, flag uint32) int32
	// aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent);
	aclrtEventElapsedTime func(ms *float32, start, end uintptr) int32
}

// eventTimeLine is ACL_EVENT_TIME_LINE: the event records a timestamp.
const eventTimeLine = 0x00000008

// eventState is what the device keeps of an event: whether it was recorded
// at least once, and whether NewTimingEvent made it.
type eventState struct {
	recorded atomic.Bool
	timing   bool
}

func (f *eventFuncs) load(l *dl.Library) error {
	err := l.Bind(
		dl.Func{Ptr: &f.aclrtCreateEvent, Name: "aclrtCreateEvent"},
		dl.Func{Ptr: &f.aclrtDestroyEvent, Name: "aclrtDestroyEvent"},
		dl.Func{Ptr: &f.aclrtRecordEvent, Name: "aclrtRecordEvent"},
		dl.Func{Ptr: &f.aclrtQueryEventStatus, Name: "aclrtQueryEventStatus"},
		dl.Func{Ptr: &f.aclrtSynchronizeEvent, Name: "aclrtSynchronizeEvent"},
	)
	if err != nil {
		return err
	}
	record, err := l.Sym("aclrtRecordEvent")
	if err != nil {
		return err
	}
	f.aclrtRecordEvent = func(event, stream uintptr) int32 { return fastCall(record, event, stream) }
	if l.Bind(dl.Func{Ptr: &f.aclrtCreateEventWithFlag, Name: "aclrtCreateEventWithFlag"},
		dl.Func{Ptr: &f.aclrtEventElapsedTime, Name: "aclrtEventElapsedTime"}) != nil {
		f.aclrtCreateEventWithFlag, f.aclrtEventElapsedTime = nil, nil
	}
	return nil
}

// recorded reports whether ev was recorded at least once. AscendCL answers
// NOT_READY for a never-recorded event; CUDA, and the device contract, say
// complete.
func (d *Device) recorded(ev device.Event) bool {
	r, _ := d.events.Get(ev)
	return r != nil && r.recorded.Load()
}

// NewEvent implements device.Device with aclrtCreateEvent.
func (d *Device) NewEvent() (device.Event, error) {
	if err := d.enter("new event"); err != nil {
		return 0, err
	}
	defer d.leave()
	return d.events.Create(func(e *uintptr) error {
		return check("aclrtCreateEvent", d.api.aclrtCreateEvent(e))
	}, new(eventState))
}

// NewTimingEvent implements device.Device with aclrtCreateEventWithFlag
// (ACL_EVENT_TIME_LINE). A runtime without event timing gives an error
// wrapping device.ErrNotSupported.
func (d *Device) NewTimingEvent() (device.Event, error) {
	if err := d.enter("new timing event"); err != nil {
		return 0, err
	}
	defer d.leave()
	if d.api.aclrtCreateEventWithFlag == nil {
		return 0, fmt.Errorf("ascend: new timing event: %s has no aclrtCreateEventWithFlag and aclrtEventElapsedTime: %w", d.api.path, device.ErrNotSupported)
	}
	return d.events.Create(func(e *uintptr) error {
		return check("aclrtCreateEventWithFlag", d.api.aclrtCreateEventWithFlag(e, eventTimeLine))
	}, &eventState{timing: true})
}

// Elapsed implements device.Device with aclrtEventElapsedTime. Events not
// made by NewTimingEvent, or never recorded, are refused here
// (device.ErrInvalidValue); ACL_ERROR_RT_EVENT_NOT_COMPLETE is
// device.ErrNotReady.
func (d *Device) Elapsed(start, end device.Event) (time.Duration, error) {
	if err := d.enter("elapsed"); err != nil {
		return 0, err
	}
	defer d.leave()
	for _, ev := range [2]device.Event{start, end} {
		r, _ := d.events.Get(ev)
		switch {
		case r == nil || !r.timing:
			return 0, fmt.Errorf("ascend: elapsed: event %#x was not made by NewTimingEvent: %w", uintptr(ev), device.ErrInvalidValue)
		case !r.recorded.Load():
			return 0, fmt.Errorf("ascend: elapsed: event %#x was never recorded: %w", uintptr(ev), device.ErrInvalidValue)
		}
	}
	var ms float32
	switch rc := d.api.aclrtEventElapsedTime(&ms, uintptr(start), uintptr(end)); Error(rc) {
	case 0:
		return time.Duration(float64(ms) * float64(time.Millisecond)), nil
	case ErrorRTEventNotComplete:
		return 0, fmt.Errorf("ascend: elapsed from event %#x to %#x: %w", uintptr(start), uintptr(end), device.ErrNotReady)
	default:
		return 0, fmt.Errorf("ascend: elapsed from event %#x to %#x: %w", uintptr(start), uintptr(end), fail("aclrtEventElapsedTime", rc))
	}
}

// DestroyEvent implements device.Device.
func (d *Device) DestroyEvent(ev device.Event) error {
	if err := d.enter("destroy event"); err != nil {
		return err
	}
	defer d.leave()
	return d.events.Destroy(ev, d.api.destroyEvent)
}

func (f *eventFuncs) destroyEvent(e uintptr) error {
	return check("aclrtDestroyEvent", f.aclrtDestroyEvent(e))
}

// Record implements device.Device with aclrtRecordEvent.
func (d *Device) Record(ev device.Event, s device.Stream) error {
	if err := d.enter("record"); err != nil {
		return err
	}
	defer d.leave()
	r, _ := d.events.Get(ev)
	if r == nil {
		return fmt.Errorf("ascend: record event %#x: not created by this device: %w", uintptr(ev), device.ErrInvalidValue)
	}
	if rc := d.api.aclrtRecordEvent(uintptr(ev), uintptr(s)); rc != 0 {
		return fmt.Errorf("ascend: record event %#x on stream %#x: %w", uintptr(ev), uintptr(s), fail("aclrtRecordEvent", rc))
	}
	r.recorded.Store(true)
	return nil
}

// Query implements device.Device with aclrtQueryEventStatus.
func (d *Device) Query(ev device.Event) (bool, error) {
	if err := d.enter("query"); err != nil {
		return false, err
	}
	defer d.leave()
	if !d.recorded(ev) {
		return true, nil
	}
	var st int32
	if rc := d.api.aclrtQueryEventStatus(uintptr(ev), &st); rc != 0 {
		return false, fmt.Errorf("ascend: query event %#x: %w", uintptr(ev), fail("aclrtQueryEventStatus", rc))
	}
	return st == eventRecordedComplete, nil
}

// SyncEvent implements device.Device with aclrtSynchronizeEvent.
func (d *Device) SyncEvent(ev device.Event) error {
	if err := d.enter("sync event"); err != nil {
		return err
	}
	defer d.leave()
	if !d.recorded(ev) {
		return nil
	}
	if rc := d.api.aclrtSynchronizeEvent(uintptr(ev)); rc != 0 {
		return fmt.Errorf("ascend: sync event %#x: %w", uintptr(ev), fail("aclrtSynchronizeEvent", rc))
	}
	return nil
}
