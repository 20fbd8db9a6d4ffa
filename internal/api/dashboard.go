package api

import (
	"embed"
	"io/fs"
	"net/http"
)

// The dashboard: one page and its script and style, embedded in
// the binary, served without a token (they hold no data). The page reads
// the JSON API with the token the operator gives it, as the CLI does.
//
//go:embed ui
var uiFiles embed.FS

// dashboardHeaders keep the page from loading anything but its own files
// and from being framed by another site.
func dashboardHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

func dashboardRoutes(mux *http.ServeMux) {
	files, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded folder is part of the binary
	}
	static := http.FileServer(http.FS(files))
	mux.Handle("GET /{$}", dashboardHeaders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, files, "index.html")
	})))
	mux.Handle("GET /ui/", dashboardHeaders(http.StripPrefix("/ui/", static)))
}
