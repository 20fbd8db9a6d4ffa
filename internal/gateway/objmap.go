package gateway

// The object map's format is internal/objmap; the gateway caches it in
// pages, so that reading one entry does not read a whole map object.
const pageEntries = 4096 // entries per cached page (16 KiB)
