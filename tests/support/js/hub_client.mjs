// The @huggingface/hub calls a user makes, against one endpoint, printed as one JSON object for the test to compare
// (tests/e2e/test_js_clients.py). Usage: node hub_client.mjs HUB_URL REPO PATH [TOKEN]
import { createHash } from "node:crypto";
import { downloadFile, fileDownloadInfo, listFiles, modelInfo } from "@huggingface/hub";

const [hubUrl, repo, path, token] = process.argv.slice(2);
const credentials = token ? { accessToken: token } : {};
const out = {};
try {
  const info = await modelInfo({ name: repo, hubUrl, ...credentials });
  out.modelInfo = { id: info.id, name: info.name, private: info.private, gated: info.gated, task: info.task ?? null };
  const files = [];
  for await (const file of listFiles({ repo, hubUrl, recursive: true, ...credentials })) {
    files.push({ path: file.path, type: file.type, size: file.size, oid: file.oid, lfs: file.lfs?.oid ?? null });
  }
  out.listFiles = files.sort((a, b) => a.path.localeCompare(b.path));
  const download = await fileDownloadInfo({ repo, path, hubUrl, ...credentials });
  out.fileDownloadInfo = { size: download.size, etag: download.etag };
  const blob = await downloadFile({ repo, path, hubUrl, ...credentials });
  const bytes = Buffer.from(await blob.arrayBuffer());
  out.downloadFile = { size: bytes.length, sha256: createHash("sha256").update(bytes).digest("hex") };
} catch (err) {
  out.error = `${err.name}: ${err.message}`;
}
console.log(JSON.stringify(out));
