package report

import (
	"bytes"
	"fmt"
	"html/template"
	"image/color"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// A Series is one named line of a chart over time.
type Series struct {
	Name   string
	Points []Point
}

// A Point is a value at a time.
type Point struct {
	At    time.Time
	Value float64
}

// chartSize is every chart's size in the page.
var chartWidth, chartHeight = 7.5 * vg.Inch, 2.6 * vg.Inch

// lines draws series over time as an inline SVG chart (gonum/plot), with
// the y axis in unit.
func lines(title, unit string, series ...Series) (template.HTML, error) {
	p := newPlot(title, unit)
	p.X.Tick.Marker = plot.TimeTicks{Format: "01-02 15:04:05"}
	for i, s := range series {
		if len(s.Points) == 0 {
			continue
		}
		xys := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			xys[j] = plotter.XY{X: float64(pt.At.UnixNano()) / 1e9, Y: pt.Value}
		}
		l, dots, err := plotter.NewLinePoints(xys)
		if err != nil {
			return "", err
		}
		l.Color, dots.Color = plotutil.Color(i), plotutil.Color(i)
		dots.GlyphStyle.Radius = vg.Points(1.5)
		p.Add(l, dots)
		p.Legend.Add(s.Name, l)
	}
	return svg(p)
}

// A Bar is one bar of a stacked bar chart: its label and its stack's
// parts, in the order of the chart's stack names.
type Bar struct {
	Label string
	Parts []float64
}

// bars draws stacked bars (one stack part per name) as an inline SVG
// chart.
func bars(title, unit string, names []string, data []Bar) (template.HTML, error) {
	p := newPlot(title, unit)
	labels := make([]string, len(data))
	for i, b := range data {
		labels[i] = b.Label
	}
	width := vg.Points(max(4, min(28, 360/float64(max(len(data), 1)))))
	var below *plotter.BarChart
	for k, name := range names {
		vs := make(plotter.Values, len(data))
		for i, b := range data {
			vs[i] = b.Parts[k]
		}
		bc, err := plotter.NewBarChart(vs, width)
		if err != nil {
			return "", err
		}
		bc.Color, bc.LineStyle.Width = plotutil.Color(k), 0
		if below != nil {
			bc.StackOn(below)
		}
		below = bc
		p.Add(bc)
		p.Legend.Add(name, bc)
	}
	p.NominalX(labels...)
	if len(labels) > 12 {
		p.X.Tick.Label.Rotation = 0.8
		p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = draw.XRight, draw.YCenter
	}
	return svg(p)
}

func newPlot(title, unit string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	p.BackgroundColor = color.White
	return p
}

// svg renders a plot as SVG markup for the page (its fonts are the
// browser's: nothing is fetched).
func svg(p *plot.Plot) (template.HTML, error) {
	w, err := p.WriterTo(chartWidth, chartHeight, "svg")
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		return "", fmt.Errorf("draw %q: %w", p.Title.Text, err)
	}
	out := b.Bytes()
	// The XML prolog is not for an SVG inside HTML.
	if i := bytes.Index(out, []byte("<svg")); i > 0 {
		out = out[i:]
	}
	return template.HTML(out), nil
}
