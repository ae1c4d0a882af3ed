// `node --import ./bench/native-timing-register.mjs bench/X.mjs`: installs the '@specd/native' timing shim
// (bench/native-timing-hooks.mjs) before X's static imports resolve, for benches whose profile pass needs it
// (bench/verify-dense.mjs --profile re-runs itself this way).
import { register } from 'node:module';

register('./native-timing-hooks.mjs', import.meta.url);
globalThis.specdNativeTimingHook = true;
