package report

import (
	"html/template"
	"io"
)

// Render writes the page: one HTML file with its style and charts
// inline.
func Render(w io.Writer, p *Page) error { return page.Execute(w, p) }

var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>lakeflow report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #111827; }
h1 { margin-bottom: 0; } h2 { border-bottom: 1px solid #d1d5db; padding-bottom: .2em; margin-top: 2em; }
.meta { color: #6b7280; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 90%; }
th, td { border: 1px solid #e5e7eb; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f9fafb; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.late { color: #b91c1c; font-weight: bold; } .ok { color: #15803d; }
figure { margin: 1em 0; } figcaption { color: #6b7280; font-size: 90%; }
.lineage { max-width: 100%; height: auto; }
.empty { color: #6b7280; font-style: italic; }
</style>
</head>
<body>
<h1>lakeflow</h1>
<p class="meta">Report made {{.Generated}}, charts over the last {{.Since}}, from the published warehouse.</p>

<table id="summary">
{{range .Summary}}<tr><th>{{.Label}}</th><td class="n" data-sql="{{.SQL}}">{{.Value}}</td></tr>
{{end}}</table>

<h2>Throughput and freshness</h2>
{{template "chart" .Throughput}}
{{template "chart" .Fresh}}

<h2>Datasets</h2>
<table id="datasets">
<tr><th>dataset</th><th>rows</th><th>freshness SLA</th><th>published data's age</th><th></th></tr>
{{range .Datasets}}<tr><td>{{.Name}}</td><td class="n" data-sql="{{.Rows.SQL}}">{{.Rows.Value}}</td><td>{{.SLA}}</td><td>{{.Age}}</td>
<td>{{if .Late}}<span class="late">late</span>{{else if ne .SLA "none"}}<span class="ok">within</span>{{end}}</td></tr>
{{end}}</table>
{{template "chart" .Lake}}
{{template "table" .LakeDays}}

<h2>Quarantine and dead letters</h2>
{{template "chart" .Quarantine}}
{{template "table" .QuarantineExamples}}
{{template "chart" .Dead}}

<h2>Last check</h2>
{{if .CheckedAt}}<p class="meta">lakeflow check at {{.CheckedAt}}{{if not .Checks.Rows}}: nothing found{{end}}</p>{{template "table" .Checks}}
{{else}}<p class="empty">No check recorded yet: lakeflow check, or lakeflow run --follow with check.interval, records one.</p>{{end}}

<h2>Schema history</h2>
{{template "chart" .Schemas}}
{{template "table" .SchemaChanges}}

<h2>Lineage</h2>
{{if .Lineage}}<figure class="graph">{{.Lineage}}<figcaption>source tables → Kafka topics → lake → silver → history and gold</figcaption></figure>
{{else}}<p class="empty">No lineage: the catalog has no dataset derived from another.</p>{{end}}

<h2>Gold marts</h2>
{{range .Marts}}{{template "table" .}}{{else}}<p class="empty">No gold mart.</p>{{end}}
</body>
</html>
{{define "chart"}}{{if .SVG}}<figure class="chart"><h3>{{.Title}}</h3>{{.SVG}}<figcaption>{{.Caption}}</figcaption></figure>
{{else}}<h3>{{.Title}}</h3><p class="empty">{{.Empty}}</p>{{end}}{{end}}
{{define "table"}}{{if .Rows}}{{if .Title}}<h3>{{.Title}}</h3>{{end}}<table>
<tr>{{range .Columns}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>{{end}}{{end}}
`))
