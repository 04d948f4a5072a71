package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// plotFormat is the image format --plot writes for path, from its
// extension: svg or png.
func plotFormat(path string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg", ".png":
		return ext[1:], nil
	case "":
		return "", fmt.Errorf("%q has no extension: want .svg or .png", path)
	default:
		return "", fmt.Errorf("%q: unknown extension %q, want .svg or .png", path, ext)
	}
}

// The plot's layout: a memory panel above a swap panel, the legend in a
// strip to their right, outside the data.
const (
	plotWidth   = 11 * vg.Inch
	plotHeight  = 7 * vg.Inch
	legendStrip = 2.4 * vg.Inch
)

// plotPlan draws the curve before and after the plan with the limit
// (labelled) in the upper panel and, in the lower one, each swap on its own
// row from the op its memory counts as free to the op its copy back starts,
// so that many swaps stay apart. The format is the file's extension.
func plotPlan(path string, r *planReport) error {
	format, err := plotFormat(path)
	if err != nil {
		return err
	}
	pol := r.policy
	gib := func(b int64) float64 { return float64(b) / (1 << 30) }
	n := len(pol.Curve)

	mem := plot.New()
	mem.Title.Text = fmt.Sprintf("%s, iteration %d\nlimit %s (planned for %s): overhead %.1f%% (bound %.1f%%), %d swaps, %d recomputes",
		filepath.Base(r.Trace), r.Iter, fmtBytes(r.LimitBytes), fmtBytes(r.PlannedBytes), r.OverheadPct, r.OverheadPctBoundPlanned, len(pol.Swaps), len(pol.Recomputes))
	mem.Title.Padding = vg.Points(6)
	mem.Y.Label.Text = "device memory, GiB"
	mem.X.Label.Text = r.xLabel()
	mem.Add(plotter.NewGrid())
	before := make(plotter.XYs, n)
	after := make(plotter.XYs, n)
	var top float64
	for t := range n {
		before[t] = plotter.XY{X: r.xAt(t), Y: gib(pol.Curve[t])}
		after[t] = plotter.XY{X: r.xAt(t), Y: gib(pol.Sim.Ops[t].Mem)}
		top = max(top, before[t].Y, after[t].Y)
	}
	lb, err := plotter.NewLine(before)
	if err != nil {
		return err
	}
	lb.Color, lb.Width = plotColor(120, 120, 120), vg.Points(1.2)
	la, err := plotter.NewLine(after)
	if err != nil {
		return err
	}
	la.Color, la.Width = plotColor(20, 90, 200), vg.Points(1.2)
	limit := gib(r.LimitBytes)
	lim, err := plotter.NewLine(plotter.XYs{{X: 0, Y: limit}, {X: r.xEnd(n), Y: limit}})
	if err != nil {
		return err
	}
	lim.Color, lim.Width = plotColor(210, 30, 30), vg.Points(1.5)
	lim.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	label, err := plotter.NewLabels(plotter.XYLabels{
		XYs:    []plotter.XY{{X: 0, Y: limit}},
		Labels: []string{"limit " + fmtBytes(r.LimitBytes)},
	})
	if err != nil {
		return err
	}
	for i := range label.TextStyle {
		label.TextStyle[i].Color = lim.Color
		label.TextStyle[i].YAlign = draw.YBottom
	}
	label.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(2)}
	mem.Add(lb, la, lim, label)
	mem.X.Min, mem.X.Max = 0, r.xEnd(n)
	mem.Y.Min, mem.Y.Max = 0, max(top, limit)*1.08

	// One row per swap and per recompute, in the order their memory
	// frees; a wrapping swap (free over the end of one step and the start
	// of the next) has two pieces on its row. Swaps are green, recomputes
	// (dropped after one op, made again before another) orange.
	lanes := plot.New()
	lanes.X.Label.Text = r.xLabel()
	lanes.Y.Label.Text = "swap or recompute (by the op it frees at)"
	lanes.X.Min, lanes.X.Max = 0, r.xEnd(n)
	type span struct {
		free, in  int
		recompute bool
	}
	spans := make([]span, 0, len(pol.Swaps)+len(pol.Recomputes))
	for x, s := range pol.Swaps {
		free := pol.Sim.Freed[x]
		if free > n {
			free -= n // freed in the next step, before its copy back
		}
		spans = append(spans, span{free: free, in: s.In})
	}
	for _, rc := range pol.Recomputes {
		spans = append(spans, span{free: rc.Drop + 1, in: rc.Before, recompute: true})
	}
	slices.SortStableFunc(spans, func(a, b span) int { return a.free - b.free })
	rows := max(len(spans), 1)
	lanes.Y.Min, lanes.Y.Max = -0.5, float64(rows)-0.5
	lanes.Y.Tick.Marker = laneTicks{}
	// Thick enough to see, thin enough that rows stay apart: about 70% of a
	// row of the lower panel (half the height, less axes).
	width := vg.Length(float64(plotHeight/2-vg.Inch) / float64(rows) * 0.7)
	width = min(max(width, vg.Points(1)), vg.Points(8))
	spanColor, rcColor := plotColor(30, 160, 80), plotColor(230, 140, 20)
	var thumb, rcThumb *plotter.Line
	for row, sp := range spans {
		free, in, y := r.xStart(sp.free), r.xStart(sp.in), float64(row)
		pieces := []plotter.XYs{{{X: free, Y: y}, {X: in, Y: y}}}
		if sp.in < sp.free {
			pieces = []plotter.XYs{{{X: 0, Y: y}, {X: in, Y: y}}, {{X: free, Y: y}, {X: r.xEnd(n), Y: y}}}
		}
		for _, xy := range pieces {
			seg, err := plotter.NewLine(xy)
			if err != nil {
				return err
			}
			seg.Color, seg.Width = spanColor, width
			if sp.recompute {
				seg.Color, rcThumb = rcColor, seg
			} else {
				thumb = seg
			}
			lanes.Add(seg)
		}
	}
	lanes.Add(plotter.NewGrid())

	// How busy each direction of the link is over each logical layer, on
	// the plan's simulated timeline.
	link, d2h, h2d, err := linkPanel(r)
	if err != nil {
		return err
	}

	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.Add("recorded", lb)
	leg.Add("with swaps", la)
	leg.Add("limit", lim)
	if thumb != nil {
		t := *thumb
		t.Width = vg.Points(4)
		leg.Add("swap: memory free\nuntil the copy back", &t)
	}
	if rcThumb != nil {
		t := *rcThumb
		t.Width = vg.Points(4)
		leg.Add("recompute: dropped\nuntil made again", &t)
	}
	if link != nil {
		leg.Add("link busy:\ncopies out (d2h)", d2h)
		leg.Add("link busy:\ncopies back (h2d)", h2d)
	}

	height := plotHeight
	if link != nil {
		height += plotHeight / 3
	}
	c, err := draw.NewFormattedCanvas(plotWidth, height, format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	dc.SetColor(color.White) // the legend strip too, not only the panels
	dc.Fill(dc.Rectangle.Path())
	data := draw.Crop(dc, 0, -legendStrip, 0, 0)
	panels := [][]*plot.Plot{{mem}, {lanes}}
	if link != nil {
		panels = append(panels, []*plot.Plot{link})
	}
	tiles := plot.Align(panels, draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4),
		PadLeft: vg.Points(4), PadRight: vg.Points(8), PadY: vg.Points(10)}, data)
	for i, row := range panels {
		row[0].Draw(tiles[i][0])
	}
	side := draw.Crop(dc, plotWidth-legendStrip+vg.Points(6), 0, 0, -vg.Points(48))
	leg.Draw(side)
	return writeCanvas(path, c)
}

// linkPanel draws, per logical layer of r's plan, the share of its time on
// the plan's simulated timeline that each direction of the link is busy
// (simulate.Result.LinkBusy): a step line each, copies out and copies
// back. nil when the plan has no logical layers or moves nothing.
func linkPanel(r *planReport) (p *plot.Plot, d2h, h2d *plotter.Line, err error) {
	sim := r.policy.Sim
	n := len(sim.Ops)
	if len(r.groups) == 0 || sim.BytesD2H+sim.BytesH2D == 0 {
		return nil, nil, nil, nil
	}
	var out, in plotter.XYs
	for _, g := range r.groups {
		if g.First < 0 || g.Last >= n || g.Last < g.First {
			continue
		}
		from, to := sim.Ops[g.First].Start, sim.Ops[g.Last].End
		if to <= from {
			continue
		}
		d, h := sim.LinkBusy(from, to)
		x0, x1 := r.xStart(g.First), r.xStart(g.Last+1)
		if g.Last+1 >= n {
			x1 = r.xEnd(n)
		}
		out = append(out, plotter.XY{X: x0, Y: d / (to - from) * 100}, plotter.XY{X: x1, Y: d / (to - from) * 100})
		in = append(in, plotter.XY{X: x0, Y: h / (to - from) * 100}, plotter.XY{X: x1, Y: h / (to - from) * 100})
	}
	if len(out) == 0 {
		return nil, nil, nil, nil
	}
	p = plot.New()
	p.X.Label.Text = r.xLabel()
	p.Y.Label.Text = "link busy, % of each layer"
	p.X.Min, p.X.Max = 0, r.xEnd(n)
	p.Y.Min, p.Y.Max = 0, 105
	p.Add(plotter.NewGrid())
	if d2h, err = plotter.NewLine(out); err != nil {
		return nil, nil, nil, err
	}
	d2h.Color, d2h.Width = plotColor(150, 60, 170), vg.Points(1.2)
	if h2d, err = plotter.NewLine(in); err != nil {
		return nil, nil, nil, err
	}
	h2d.Color, h2d.Width = plotColor(20, 150, 150), vg.Points(1.2)
	h2d.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
	p.Add(d2h, h2d)
	return p, d2h, h2d, nil
}

// plotInfeasible draws, for a limit no plan meets, the curve kept under
// it with the limit and the lowest limit a plan meets, and marks the op
// where the limit falls short most. The format is the file's extension.
func plotInfeasible(path string, r *planReport) error {
	format, err := plotFormat(path)
	if err != nil {
		return err
	}
	gib := func(b int64) float64 { return float64(b) / (1 << 30) }
	n := len(r.curve)
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, iteration %d\nlimit %s cannot be met %s: no plan", filepath.Base(r.Trace), r.Iter, fmtBytes(r.LimitBytes), movedBy(r.recompute))
	if r.LowestFeasibleBytes > 0 {
		p.Title.Text += fmt.Sprintf("; lowest feasible limit %s (%.1f%% of the peak)", fmtBytes(r.LowestFeasibleBytes), r.LowestFeasiblePct)
	}
	p.Title.Padding = vg.Points(6)
	p.Y.Label.Text = "device memory, GiB"
	p.X.Label.Text = r.xLabel()
	p.Add(plotter.NewGrid())
	xy := make(plotter.XYs, n)
	var top float64
	for t := range n {
		xy[t] = plotter.XY{X: r.xAt(t), Y: gib(r.curve[t])}
		top = max(top, xy[t].Y)
	}
	lc, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	lc.Color, lc.Width = plotColor(120, 120, 120), vg.Points(1.2)
	p.Add(lc)
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.Add(r.Curve+" curve", lc)
	hline := func(b int64, label string, c color.Color) error {
		y := gib(b)
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: y}, {X: r.xEnd(n), Y: y}})
		if err != nil {
			return err
		}
		l.Color, l.Width = c, vg.Points(1.5)
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		lb, err := plotter.NewLabels(plotter.XYLabels{XYs: []plotter.XY{{X: 0, Y: y}}, Labels: []string{label + " " + fmtBytes(b)}})
		if err != nil {
			return err
		}
		for i := range lb.TextStyle {
			lb.TextStyle[i].Color = c
			lb.TextStyle[i].YAlign = draw.YBottom
		}
		lb.Offset = vg.Point{X: vg.Points(4), Y: vg.Points(2)}
		p.Add(l, lb)
		leg.Add(label, l)
		top = max(top, y)
		return nil
	}
	if err := hline(r.LimitBytes, "limit", plotColor(210, 30, 30)); err != nil {
		return err
	}
	if r.LowestFeasibleBytes > 0 {
		if err := hline(r.LowestFeasibleBytes, "lowest feasible limit", plotColor(30, 160, 80)); err != nil {
			return err
		}
	}
	if at := r.shortAt; at >= 0 && at < n {
		mark, err := plotter.NewLine(plotter.XYs{{X: r.xAt(at), Y: 0}, {X: r.xAt(at), Y: gib(r.curve[at])}})
		if err != nil {
			return err
		}
		mark.Color, mark.Width = plotColor(230, 140, 20), vg.Points(1.2)
		p.Add(mark)
		leg.Add(fmt.Sprintf("op %d: %s over\nwith every idle\ntensor moved", r.Shortfall.Op, fmtBytes(r.Shortfall.Bytes)), mark)
	}
	p.X.Min, p.X.Max = 0, r.xEnd(n)
	p.Y.Min, p.Y.Max = 0, top*1.08

	c, err := draw.NewFormattedCanvas(plotWidth, plotHeight/2+vg.Inch, format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	p.Draw(draw.Crop(dc, vg.Points(4), -legendStrip, vg.Points(4), -vg.Points(4)))
	leg.Draw(draw.Crop(dc, plotWidth-legendStrip+vg.Points(6), 0, 0, -vg.Points(48)))
	return writeCanvas(path, c)
}

// writeCanvas writes a drawn canvas to path.
func writeCanvas(path string, c vg.CanvasWriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// laneTicks numbers the swap rows: about eight labelled ticks whatever the
// number of rows.
type laneTicks struct{}

func (laneTicks) Ticks(lo, hi float64) []plot.Tick {
	rows := int(hi - lo + 0.5) // lo is -0.5
	step := max(1, (rows+7)/8)
	if step > 5 {
		step = (step + 4) / 5 * 5
	}
	var ts []plot.Tick
	for i := 0; i < rows; i += step {
		ts = append(ts, plot.Tick{Value: float64(i), Label: fmt.Sprint(i + 1)})
	}
	return ts
}

// The plot's x axis (--plot-x): op index, or with plotTime the estimated
// time without the plan, in ms (opMS: each op's start, and the end).

func (r *planReport) timeAxis() bool { return r.plotTime && len(r.opMS) > 1 }

func (r *planReport) xLabel() string {
	if r.timeAxis() {
		return fmt.Sprintf("time, ms (op times: %s, without the plan)", r.TimeBase)
	}
	return "op"
}

// xAt is where the bytes after op t go: op t, or its end.
func (r *planReport) xAt(t int) float64 {
	if r.timeAxis() {
		return r.opMS[min(t+1, len(r.opMS)-1)]
	}
	return float64(t)
}

// xStart is where op t starts: op t, or its start time.
func (r *planReport) xStart(t int) float64 {
	if r.timeAxis() {
		return r.opMS[min(max(t, 0), len(r.opMS)-1)]
	}
	return float64(t)
}

// xEnd is the axis's end for n ops.
func (r *planReport) xEnd(n int) float64 {
	if r.timeAxis() {
		return r.opMS[len(r.opMS)-1]
	}
	return float64(max(n-1, 1))
}

func plotColor(r, g, b uint8) color.Color { return color.RGBA{R: r, G: g, B: b, A: 255} }
