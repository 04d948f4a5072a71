package host

import (
	"fmt"
	"sync"
	"time"

	"github.com/chameleon-go/chameleon/device"
)

// stream is a FIFO of work run by one goroutine. The queue is unbounded so
// that queuing never blocks the caller, as with a real device.
type stream struct {
	mu      sync.Mutex
	cond    sync.Cond
	q       []op
	busy    bool // the worker is running an op it took off q
	stopped bool
	// now is the stream's modeled clock as of the last op it ran (see
	// Device's Elapsed), written by the worker with busy cleared.
	now time.Duration
}

// idleNow reports whether everything queued on s so far has completed, and
// then the stream's modeled clock.
func (s *stream) idleNow() (bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.q) == 0 && !s.busy, s.now
}

type opKind uint8

const (
	opCopy opKind = iota
	opSignal
	opWait
	opFunc  // a host function queued with Launch
	opClock // moves the modeled clock to at, if behind: a wait on work already done
)

// Link directions for the link model; D2D copies do not use the link.
const (
	dirH2D = iota
	dirD2H
	dirD2D
)

type op struct {
	kind     opKind
	dir      int
	dst, src []byte
	f        *fence
	fn       func()
	// cost is the modeled time of an opFunc (LaunchFor); at the time an
	// opClock moves the clock to.
	cost, at time.Duration
}

// fence marks a point in a stream: it is closed once the stream's work up to
// that point has run. Every Record makes a new fence, so a StreamWait keeps
// waiting for the record it saw even if the event is recorded again.
type fence struct {
	ch chan struct{}
	at time.Duration // the stream's modeled clock when it was reached, set before ch closes
}

func newFence() *fence { return &fence{ch: make(chan struct{})} }

// doneFence is the fence of an event recorded on an idle stream: the work
// it captures has already completed. Sharing it keeps such records (the
// common case for the compute stream of a host that runs its kernels
// synchronously) free of allocations.
var doneFence = func() *fence { f := newFence(); close(f.ch); return f }()

func (f *fence) done() bool {
	select {
	case <-f.ch:
		return true
	default:
		return false
	}
}

type event struct {
	cur *fence // nil: never recorded, so complete
	// timing: made by NewTimingEvent, its records carry a time (a fence of
	// their own even on an idle stream).
	timing bool
	// idleAt is the modeled clock of the idle stream the event was last
	// recorded on (cur is doneFence then).
	idleAt time.Duration
}

// at is the modeled time of the event's latest record, which is complete.
func (e *event) at() time.Duration {
	if e.cur == doneFence {
		return e.idleAt
	}
	return e.cur.at
}

// startStream starts a stream goroutine. Called with d.mu held or before d
// is shared.
func (d *Device) startStream() *stream {
	s := &stream{}
	s.cond.L = &s.mu
	d.workers.Add(1)
	go d.run(s)
	return s
}

func (s *stream) push(o op) {
	s.mu.Lock()
	s.q = append(s.q, o)
	s.mu.Unlock()
	s.cond.Signal()
}

// stop lets the goroutine exit once the queue is drained: work already queued
// still runs, as after cudaStreamDestroy.
func (s *stream) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.cond.Signal()
}

func (d *Device) run(s *stream) {
	defer d.workers.Done()
	for {
		s.mu.Lock()
		for len(s.q) == 0 && !s.stopped {
			s.cond.Wait()
		}
		if len(s.q) == 0 {
			s.mu.Unlock()
			return
		}
		o := s.q[0]
		s.q[0] = op{}
		s.q = s.q[1:]
		s.busy = true
		now := s.now
		s.mu.Unlock()
		now = d.exec(o, now)
		s.mu.Lock()
		s.busy = false
		s.now = now
		s.mu.Unlock()
	}
}

// exec runs o on a stream whose modeled clock reads now, and returns the
// clock after it. The clock counts modeled time alone: a copy's time on the
// link model (WithBandwidth), a LaunchFor's cost, and waits for work on
// other streams; the host's own time never moves it.
func (d *Device) exec(o op, now time.Duration) time.Duration {
	switch o.kind {
	case opSignal:
		o.f.at = now
		close(o.f.ch)
	case opWait:
		<-o.f.ch
		now = max(now, o.f.at)
	case opClock:
		now = max(now, o.at)
	case opFunc:
		if o.fn != nil {
			o.fn()
		}
		now += o.cost
	case opCopy:
		var bw float64
		switch o.dir {
		case dirH2D:
			bw = d.cfg.h2d
		case dirD2H:
			bw = d.cfg.d2h
		}
		if bw <= 0 {
			copy(o.dst, o.src)
			return now
		}
		dur := time.Duration(float64(len(o.dst)) / bw * float64(time.Second))
		d.links[o.dir].Lock()
		d.cfg.sleep(dur)
		copy(o.dst, o.src)
		// One direction's copies take turns on the link, in modeled time too.
		now = max(now, d.linkAt[o.dir]) + dur
		d.linkAt[o.dir] = now
		d.links[o.dir].Unlock()
	}
	return now
}

// DefaultStream implements device.Device.
func (d *Device) DefaultStream() device.Stream { return 0 }

// NewStream implements device.Device.
func (d *Device) NewStream() (device.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("host: new stream: %w", device.ErrClosed)
	}
	h := d.nextStream
	d.nextStream++
	d.streams[h] = d.startStream()
	return h, nil
}

// DestroyStream implements device.Device. The default stream cannot be
// destroyed.
func (d *Device) DestroyStream(h device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("host: destroy stream %d: %w", h, device.ErrClosed)
	}
	s, ok := d.streams[h]
	if !ok || h == 0 {
		return fmt.Errorf("host: destroy stream %d: %w", h, device.ErrInvalidValue)
	}
	delete(d.streams, h)
	s.stop()
	return nil
}

// stream looks up h. Called with d.mu held.
func (d *Device) stream(what string, h device.Stream) (*stream, error) {
	if d.closed {
		return nil, fmt.Errorf("host: %s: %w", what, device.ErrClosed)
	}
	s, ok := d.streams[h]
	if !ok {
		return nil, fmt.Errorf("host: %s: unknown stream %d: %w", what, h, device.ErrInvalidValue)
	}
	return s, nil
}

// event looks up h. Called with d.mu held.
func (d *Device) event(what string, h device.Event) (*event, error) {
	if d.closed {
		return nil, fmt.Errorf("host: %s: %w", what, device.ErrClosed)
	}
	e, ok := d.events[h]
	if !ok {
		return nil, fmt.Errorf("host: %s: unknown event %d: %w", what, h, device.ErrInvalidValue)
	}
	return e, nil
}

// enqueueCopy resolves device ranges now, so that a later Free cannot pull
// memory from under queued work.
func (d *Device) enqueueCopy(what string, h device.Stream, dir int, dst, src func() ([]byte, error)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, err := d.stream(what, h)
	if err != nil {
		return err
	}
	db, err := dst()
	if err != nil {
		return fmt.Errorf("host: %s: dst: %w", what, err)
	}
	sb, err := src()
	if err != nil {
		return fmt.Errorf("host: %s: src: %w", what, err)
	}
	s.push(op{kind: opCopy, dir: dir, dst: db, src: sb})
	return nil
}

// CopyH2D implements device.Device.
func (d *Device) CopyH2D(dst device.DevPtr, src device.HostBuf, s device.Stream) error {
	return d.enqueueCopy("copy h2d", s, dirH2D,
		func() ([]byte, error) { return d.resolve(dst, src.Len()) },
		func() ([]byte, error) { return src.Bytes(), nil })
}

// CopyD2H implements device.Device.
func (d *Device) CopyD2H(dst device.HostBuf, src device.DevPtr, s device.Stream) error {
	return d.enqueueCopy("copy d2h", s, dirD2H,
		func() ([]byte, error) { return dst.Bytes(), nil },
		func() ([]byte, error) { return d.resolve(src, dst.Len()) })
}

// CopyD2D implements device.Device.
func (d *Device) CopyD2D(dst, src device.DevPtr, n int64, s device.Stream) error {
	return d.enqueueCopy("copy d2d", s, dirD2D,
		func() ([]byte, error) { return d.resolve(dst, n) },
		func() ([]byte, error) { return d.resolve(src, n) })
}

// NewEvent implements device.Device.
func (d *Device) NewEvent() (device.Event, error) { return d.newEvent("new event", false) }

// NewTimingEvent implements device.Device. Its records carry the stream's
// modeled clock (see Elapsed).
func (d *Device) NewTimingEvent() (device.Event, error) { return d.newEvent("new timing event", true) }

// newEvent makes an event, with the stream's modeled clock in its records
// when timing.
func (d *Device) newEvent(what string, timing bool) (device.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fmt.Errorf("host: %s: %w", what, device.ErrClosed)
	}
	h := d.nextEvent
	d.nextEvent++
	d.events[h] = &event{timing: timing}
	return h, nil
}

// Elapsed implements device.Device on the streams' modeled clocks: each
// stream's clock advances by the modeled time of the work it runs (a copy's
// time on the link model of WithBandwidth, the cost of a LaunchFor) and, at a
// StreamWait, to the time of the work waited for; time the host spends
// between calls does not count. With no link model and no LaunchFor, every
// elapsed time is zero.
func (d *Device) Elapsed(start, end device.Event) (time.Duration, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var at [2]time.Duration
	for i, h := range [2]device.Event{start, end} {
		e, err := d.event("elapsed", h)
		switch {
		case err != nil:
			return 0, err
		case !e.timing:
			return 0, fmt.Errorf("host: elapsed: event %d was not made by NewTimingEvent: %w", h, device.ErrInvalidValue)
		case e.cur == nil:
			return 0, fmt.Errorf("host: elapsed: event %d was never recorded: %w", h, device.ErrInvalidValue)
		case !e.cur.done():
			return 0, fmt.Errorf("host: elapsed: event %d: %w", h, device.ErrNotReady)
		}
		at[i] = e.at()
	}
	return at[1] - at[0], nil
}

// DestroyEvent implements device.Device. Waits already queued on the event
// still resolve.
func (d *Device) DestroyEvent(h device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.event("destroy event", h); err != nil {
		return err
	}
	delete(d.events, h)
	return nil
}

// Record implements device.Device.
func (d *Device) Record(h device.Event, sh device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, err := d.event("record", h)
	if err != nil {
		return err
	}
	s, err := d.stream("record", sh)
	if err != nil {
		return err
	}
	if idle, now := s.idleNow(); idle {
		if e.timing {
			f := newFence()
			f.at = now
			close(f.ch)
			e.cur = f
			return nil
		}
		e.cur, e.idleAt = doneFence, now
		return nil
	}
	f := newFence()
	e.cur = f
	s.push(op{kind: opSignal, f: f})
	return nil
}

// StreamWait implements device.Device.
func (d *Device) StreamWait(sh device.Stream, h device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, err := d.event("stream wait", h)
	if err != nil {
		return err
	}
	s, err := d.stream("stream wait", sh)
	if err != nil {
		return err
	}
	switch {
	case e.cur == nil:
	case !e.cur.done():
		s.push(op{kind: opWait, f: e.cur})
	case e.at() > 0:
		// Done already, but later in modeled time than s may be.
		s.push(op{kind: opClock, at: e.at()})
	}
	return nil
}

// current returns the fence of h's latest record, nil if never recorded.
func (d *Device) current(what string, h device.Event) (*fence, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, err := d.event(what, h)
	if err != nil {
		return nil, err
	}
	return e.cur, nil
}

// Query implements device.Device.
func (d *Device) Query(h device.Event) (bool, error) {
	f, err := d.current("query", h)
	if err != nil {
		return false, err
	}
	return f == nil || f.done(), nil
}

// SyncEvent implements device.Device.
func (d *Device) SyncEvent(h device.Event) error {
	f, err := d.current("sync event", h)
	if err != nil {
		return err
	}
	if f != nil {
		<-f.ch
	}
	return nil
}

// SyncStream implements device.Device.
func (d *Device) SyncStream(h device.Stream) error {
	d.mu.Lock()
	s, err := d.stream("sync stream", h)
	if err != nil {
		d.mu.Unlock()
		return err
	}
	f := newFence()
	s.push(op{kind: opSignal, f: f})
	d.mu.Unlock()
	<-f.ch
	return nil
}

// syncAll waits for the work queued on every stream so far.
func (d *Device) syncAll() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return device.ErrClosed
	}
	fences := make([]*fence, 0, len(d.streams))
	for _, s := range d.streams {
		f := newFence()
		s.push(op{kind: opSignal, f: f})
		fences = append(fences, f)
	}
	d.mu.Unlock()
	for _, f := range fences {
		<-f.ch
	}
	return nil
}
