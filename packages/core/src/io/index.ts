/** @specd/core io: checkpoint weights (safetensors), HF config.json, tokenizers. */
export {
  SAFETENSORS_DTYPES,
  SAFETENSORS_MAX_HEADER_BYTES,
  SafetensorsError,
  dtypeBits,
  dtypeViewBytes,
  isSafetensorsDtype,
  type SafetensorsDtype,
  type SafetensorsHeader,
  type SafetensorsRule,
  type TensorData,
  type TensorInfo,
  type TypedArrayFor,
} from './safetensors-format.js';
export { SafetensorsFile, type LoadedTensor } from './safetensors.js';
export {
  SAFETENSORS_INDEX_FILE,
  SAFETENSORS_SINGLE_FILE,
  SafetensorsCheckpoint,
  readSafetensorsIndex,
  type SafetensorsIndex,
} from './safetensors-checkpoint.js';
export { serializeSafetensors, writeSafetensors, type TensorToWrite, type TensorsToWrite } from './safetensors-writer.js';
export { HfConfig, HfConfigError, type NumberBounds } from './hf-config.js';
export { Tokenizer, TokenizerError, type DecodeOptions, type EncodeOptions, type TokenizerSources } from './tokenizer.js';
export { IncrementalDetokenizer, type IncrementalDetokenizerOptions } from './detokenizer.js';
export { StrictJsonError, isJsonObject, parseStrictJson, type JsonObject, type JsonValue, type StrictJsonOptions } from './strict-json.js';
export { WeightReader, type WeightReaderOptions } from './weight-reader.js';
